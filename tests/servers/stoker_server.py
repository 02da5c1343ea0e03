"""``stoker serve`` as a real process on loopback, for tests of the data service.

``StokerServer(datasets, *extra)`` starts ``python -m stoker.tools serve DATASET... --host
127.0.0.1 --port 0 EXTRA...``, reads the URL it prints, and is a context manager that stops it
with SIGTERM (graceful; SIGKILL after a grace period). ``kill()``, ``pause()`` and ``resume()``
send SIGKILL, SIGSTOP and SIGCONT for fault tests.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

__all__ = ["StokerServer"]

_SUPPORT = str(Path(__file__).resolve().parent)


class StokerServer:
    """One ``stoker serve`` process; ``url`` once it listens."""

    def __init__(self, datasets: Sequence[Any], *extra: str, env: dict | None = None) -> None:
        path = os.pathsep.join([_SUPPORT, os.environ.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stoker.tools", "serve", *map(str, datasets), "--host",
             "127.0.0.1", "--port", "0", *extra], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": path,
                                                    **(env or {})})
        line = self.proc.stdout.readline().strip() if self.proc.stdout else ""
        if not line.startswith("grpc://"):
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.proc.kill()
            raise RuntimeError(f"stoker serve did not start: {line!r} {err[-2000:]}")
        self.url = line

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self, grace: float = 30.0) -> int:
        """SIGTERM (after SIGCONT, in case it is paused); the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        return int(self.proc.returncode)

    def __enter__(self) -> "StokerServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
