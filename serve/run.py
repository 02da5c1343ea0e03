"""Running servers: one in this process until SIGTERM, ``--workers N`` processes, status.

A server prints its URL (``grpc://host:port``) as the first line of stdout once it listens,
so whatever starts it (a shell, systemd, the Dask launcher, a test) can read where it is.
SIGTERM or SIGINT stops it gracefully: no new requests, in-flight ones finish, then exit 0.
With ``--workers N`` this process starts N single servers (ports P, P+1, ...; or each a free
port with ``--port 0``), prints their URLs, and forwards SIGTERM to them (Python Flight
handlers share one GIL, so a machine with many cores runs one server per few cores).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

__all__ = ["ServeOptions", "fetch_status", "serve_forever", "serve_workers"]


@dataclass
class ServeOptions:
    """What ``stoker serve`` was asked for."""

    datasets: list[str]
    host: str = "127.0.0.1"
    port: int = 0
    workers: int = 1
    token_file: str | None = None
    transforms: list[str] = field(default_factory=list)
    cache_dir: str | None = None
    cache_limit: str | None = None

    def argv(self, port: int) -> list[str]:
        """The command line of one single-process server of these options."""
        out = ["serve", *self.datasets, "--host", self.host, "--port", str(port)]
        if self.token_file:
            out += ["--token-file", self.token_file]
        for t in self.transforms:
            out += ["--transform", t]
        if self.cache_dir:
            out += ["--cache-dir", self.cache_dir]
        if self.cache_limit:
            out += ["--cache-limit", self.cache_limit]
        return out


def serve_forever(options: ServeOptions) -> int:
    """One server in this process until SIGTERM/SIGINT; prints its URL first."""
    from stoker.serve.auth import read_token
    from stoker.serve.catalog import Catalog
    from stoker.serve.server import BatchServer
    from stoker.serve.transforms import NamedTransform

    transforms = [NamedTransform.load(name) for name in options.transforms]
    catalog = Catalog(options.datasets, transforms, options.cache_dir, options.cache_limit)
    token = read_token(options.token_file) if options.token_file else None
    server = BatchServer(catalog, f"grpc://{options.host}:{options.port}", token)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(server.url, flush=True)
    names = ", ".join(d["location"] for d in catalog.describe())
    print(f"stoker serve: serving {names} at {server.url} (pid {server.status()['pid']}); "
          "SIGTERM stops it", file=sys.stderr, flush=True)
    while not stop.wait(0.2):
        pass
    server.stop()
    print(f"stoker serve: {server.url} stopped after {server.counters.batches} batches",
          file=sys.stderr, flush=True)
    return 0


def serve_workers(options: ServeOptions) -> int:
    """``--workers N``: N single servers as child processes; their URLs, one a line."""
    procs = []
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        for i in range(options.workers):
            port = options.port + i if options.port else 0
            proc = subprocess.Popen([sys.executable, "-m", "stoker.tools",
                                     *options.argv(port)], stdout=subprocess.PIPE, text=True)
            procs.append(proc)
            line = proc.stdout.readline().strip() if proc.stdout else ""
            if not line.startswith("grpc://"):
                print(f"stoker serve: worker {i} did not start (exit {proc.wait()})",
                      file=sys.stderr)
                return 1
            print(line, flush=True)
        while not stop.wait(0.2):
            if any(p.poll() is not None for p in procs):
                print("stoker serve: a worker exited; stopping the others", file=sys.stderr)
                break
    finally:
        stop_all(procs)
    return 0


def stop_all(procs: Sequence[subprocess.Popen], grace: float = 30.0) -> None:
    """SIGTERM each process (graceful), then wait; SIGKILL one still alive after ``grace``."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def fetch_status(url: str, token: str | None = None, timeout: float = 10.0) -> dict[str, Any]:
    """The ``status`` action of the server at ``url`` as a dict."""
    import pyarrow.flight as flight

    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    from stoker.serve.catalog import ServeError

    client = flight.FlightClient(url)
    try:
        results = list(client.do_action(flight.Action("status", b""),
                                        flight.FlightCallOptions(timeout=timeout,
                                                                 headers=headers)))
    except flight.FlightError as exc:
        text = str(exc).split(". Detail:")[0].split(". gRPC client debug context")[0]
        raise ServeError(f"no status from {url}: {type(exc).__name__}: {text}") from None
    finally:
        client.close()
    return json.loads(results[0].body.to_pybytes())
