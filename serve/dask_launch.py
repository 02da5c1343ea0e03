"""``stoker serve --dask SCHEDULER DATASET...``: one server per worker of a running Dask cluster.

Dask (dask.distributed, the engine the sharder uses) only places the servers: each worker
starts ``stoker serve`` as its own process (its own GIL, bound to the worker's host, a free
port) and hands back the URL it printed; this command prints the URLs, one a line, and waits.
SIGTERM or SIGINT stops every server it started (gracefully: their in-flight requests finish)
and leaves the cluster running. No cluster manager of our own.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import uuid
from typing import Any

from stoker.serve.run import ServeOptions, stop_all

__all__ = ["serve_on_dask", "start_on_worker", "stop_on_worker"]

_STARTED: dict[str, list[subprocess.Popen]] = {}  # launch id -> servers (in each worker)


def start_on_worker(launch: str, argv: list[str], dask_worker: Any = None) -> str:
    """Run inside a Dask worker: start one server on the worker's host; its URL."""
    host = dask_worker.address.split("://", 1)[-1].rsplit(":", 1)[0] if dask_worker else \
        "127.0.0.1"
    proc = subprocess.Popen([sys.executable, "-m", "stoker.tools", "serve", *argv, "--host",
                             host, "--port", "0"], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip() if proc.stdout else ""
    if not line.startswith("grpc://"):
        code = proc.wait()
        raise RuntimeError(f"stoker serve did not start on Dask worker {host} (exit {code}); "
                           "see the worker's log.")
    _STARTED.setdefault(launch, []).append(proc)
    return line


def stop_on_worker(launch: str) -> list[int]:
    """Run inside a Dask worker: stop the servers of ``launch``; their exit codes."""
    procs = _STARTED.pop(launch, [])
    stop_all(procs)
    for proc in procs:
        if proc.stdout is not None:
            proc.stdout.close()
    return [int(p.returncode) for p in procs]


def serve_on_dask(scheduler: str, options: ServeOptions) -> int:
    """Start the servers, print their URLs, wait for SIGTERM/SIGINT, stop them."""
    from distributed import Client

    argv = options.argv(0)[1:]  # datasets and options, without "serve"
    cut = argv.index("--host")
    argv = argv[:cut] + argv[cut + 4:]  # each worker binds its own host and a free port
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    launch = uuid.uuid4().hex
    with Client(scheduler, timeout="30s") as client:
        try:
            urls = client.run(start_on_worker, launch, argv)
            for worker in sorted(urls):
                print(urls[worker], flush=True)
            print(f"stoker serve: {len(urls)} servers on the workers of {scheduler}; SIGTERM "
                  "stops them", file=sys.stderr, flush=True)
            while not stop.wait(0.2):
                pass
        finally:
            codes = client.run(stop_on_worker, launch)
    failed = {w: c for w, c in codes.items() if any(codes[w])}
    if failed:
        print(f"stoker serve: servers exited with {failed}", file=sys.stderr)
        return 1
    print(f"stoker serve: stopped {sum(len(c) for c in codes.values())} servers",
          file=sys.stderr)
    return 0
