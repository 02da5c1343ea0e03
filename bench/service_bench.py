"""The data service against the local loader and the raw Arrow Flight ceiling (issue 16).

One run, W1 (tabular, batch 1024) and W2 (64x64 JPEGs, batch 256), shuffle on, each case
warmed up then timed over ``--batches`` batches, ``--repeats`` times (medians):

* ``local``: ``DataLoader(dataset)`` in this process (``num_workers=0``);
* ``service 1``: ``DataLoader(dataset, workers=WorkerOptions(service=[one server]))``;
* ``service 2``: two servers (pinned to different cores with ``taskset`` when there are two);
* ``flight ceiling``: a Flight server that answers every request with one pre-built batch of
  the same bytes (encoded once by the real server code), read by a client with the same window
  of requests in flight (``do_get`` + read + zero-copy NumPy views): what the transport allows.

Rows/s, MB/s (the batch's tensor bytes) and the ratio to the ceiling. Servers and trainer
share this machine's cores, so a one-machine run measures overhead, not scaling.

    .venv/bin/python bench/service_bench.py                # W1 200k rows, W2 10k images
    .venv/bin/python bench/service_bench.py --batches 100 --repeats 1
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import loader_bench as lb  # noqa: E402 - W1/W2 data and their loader arguments

WINDOW = 4


def loader_kw(kind: str) -> dict[str, Any]:
    from stoker.loader import ImageOptions, ReadOptions

    if kind == "w1":
        return dict(batch_size=lb.W1_BATCH, shuffle=True, seed=0, columns=["seq", "label"],
                    read=ReadOptions(features=lb.FEATURES, categoricals=lb.CATS))
    return dict(batch_size=lb.W2_BATCH, shuffle=True, seed=0, columns=["label"],
                read=ReadOptions(image=ImageOptions("jpg", size=(lb.SIDE, lb.SIDE))))


def nbytes(batch: Any) -> int:
    return sum(v.numel() * v.element_size() for v in batch.values() if hasattr(v, "numel"))


# -- servers -----------------------------------------------------------------------------------
def start(argv: list[str], core: int | None) -> tuple[subprocess.Popen, str]:
    pin = ["taskset", "-c", str(core)] if core is not None and shutil.which("taskset") else []
    proc = subprocess.Popen([*pin, *argv], stdout=subprocess.PIPE, text=True)
    url = proc.stdout.readline().strip() if proc.stdout else ""
    if not url.startswith("grpc://"):
        raise RuntimeError(f"{argv} did not start")
    return proc, url


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=60)


def ceiling_server(dataset: str, kind: str) -> None:
    """Serve one pre-built batch of ``dataset`` (the real server's bytes) to every request."""
    import pyarrow as pa
    import pyarrow.flight as flight

    from stoker.loader import DataLoader, WorkerOptions
    from stoker.loader.service.key import BatchKey
    from stoker.loader.service.wire import encode_batch
    from stoker.serve.catalog import Catalog

    probe = DataLoader(dataset, workers=WorkerOptions(service=["grpc://unused:1"]),
                       **loader_kw(kind))
    key = BatchKey(dataset=probe._source.fingerprint, order=probe.order_options.to_dict(),
                   read=probe._source.read, seed=0, epoch=0, step=0, rank=0, world_size=1,
                   batch_size=probe.batch_size, drop_last=False)
    record = encode_batch(*Catalog([dataset]).batch(key))

    class Ceiling(flight.FlightServerBase):
        def do_get(self, context: Any, ticket: Any) -> Any:
            return flight.RecordBatchStream(pa.RecordBatchReader.from_batches(record.schema,
                                                                              [record]))

    server = Ceiling("grpc://127.0.0.1:0")
    print(f"grpc://127.0.0.1:{server.port}", flush=True)
    server.serve()


# -- cases ---------------------------------------------------------------------------------------
def timed(batches: Iterator[Any], warm: int, n: int) -> tuple[float, int]:
    """(seconds, bytes) of ``n`` batches after ``warm`` untimed ones."""
    for _ in range(warm):
        next(batches)
    size, t0 = 0, time.perf_counter()
    for _ in range(n):
        size += nbytes(next(batches))
    return time.perf_counter() - t0, size


def forever(make: Callable[[], Any]) -> Iterator[Any]:
    loader, epoch = make(), 0
    while True:
        loader.set_epoch(epoch)
        yield from loader
        epoch += 1


def ceiling_batches(url: str) -> Iterator[Any]:
    import pyarrow.flight as flight

    client = flight.FlightClient(url)

    def one(i: int) -> dict[str, Any]:
        record = client.do_get(flight.Ticket(str(i).encode())).read_chunk().data
        out = {}
        for name, column in zip(record.schema.names, record.columns):
            buf = column.buffers()[2] if len(column.buffers()) > 2 else None
            if buf is not None:  # the zero-copy view a trainer's conversion starts from
                out[name] = _Sized(np.frombuffer(buf, np.uint8).nbytes)
        return out

    with ThreadPoolExecutor(WINDOW) as pool:
        ahead = [pool.submit(one, i) for i in range(WINDOW)]
        i = WINDOW
        while True:
            yield ahead.pop(0).result()
            ahead.append(pool.submit(one, i))
            i += 1


class _Sized:
    def __init__(self, n: int) -> None:
        self.n = n

    def numel(self) -> int:
        return self.n

    def element_size(self) -> int:
        return 1


def run(kind: str, dataset: str, warm: int, n: int, repeats: int) -> list[dict[str, Any]]:
    from stoker.loader import DataLoader, WorkerOptions
    from stoker.loader.service.options import Service

    serve = [sys.executable, "-m", "stoker.tools", "serve", dataset, "--host", "127.0.0.1"]
    two = (os.cpu_count() or 1) >= 2
    servers = [start(serve, 0 if two else None), start(serve, 1 if two else None)]
    ceiling = start([sys.executable, __file__, "--ceiling-server", dataset, "--kind", kind],
                    0 if two else None)
    urls = [u for _, u in servers]
    kw = loader_kw(kind)
    cases: dict[str, Callable[[], Iterator[Any]]] = {
        "local": lambda: forever(lambda: DataLoader(dataset, **kw)),
        "service 1": lambda: forever(lambda: DataLoader(
            dataset, workers=WorkerOptions(service=Service(urls[:1], window=WINDOW)), **kw)),
        "service 2": lambda: forever(lambda: DataLoader(
            dataset, workers=WorkerOptions(service=Service(urls, window=WINDOW)), **kw)),
        "flight ceiling": lambda: ceiling_batches(ceiling[1]),
    }
    rows = []
    try:
        for name, make in cases.items():
            runs = [timed(make(), warm, n) for _ in range(repeats)]
            secs = statistics.median(s for s, _ in runs)
            size = runs[0][1]
            rows.append({"workload": kind, "case": name, "rows_s": n * kw["batch_size"] / secs,
                         "mb_s": size / secs / 1e6, "batches_s": n / secs})
    finally:
        for proc, _ in [*servers, ceiling]:
            stop(proc)
    top = next(r["rows_s"] for r in rows if r["case"] == "flight ceiling")
    one = next(r["rows_s"] for r in rows if r["case"] == "service 1")
    for r in rows:
        r["vs_ceiling"] = r["rows_s"] / top
        r["vs_one_server"] = r["rows_s"] / one
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--images", type=int, default=10_000)
    ap.add_argument("--batches", type=int, default=200, help="timed batches per case")
    ap.add_argument("--warm", type=int, default=30, help="untimed batches first")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/stoker-serve-bench"))
    ap.add_argument("--ceiling-server", help=argparse.SUPPRESS)
    ap.add_argument("--kind", default="w1", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.ceiling_server:
        ceiling_server(args.ceiling_server, args.kind)
        return 0
    lb.prepare(args.workdir, args.rows, args.images)
    datasets = {"w1": args.workdir / f"w1-{args.rows}" / "stoker",
                "w2": args.workdir / f"w2-{args.images}" / "stoker"}
    print("| workload | case | rows/s | MB/s | batches/s | vs ceiling | vs 1 server |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for kind, path in datasets.items():
        for r in run(kind, str(path), args.warm, args.batches, args.repeats):
            print(f"| {r['workload'].upper()} | {r['case']} | {r['rows_s']:,.0f} | "
                  f"{r['mb_s']:,.0f} | {r['batches_s']:,.0f} | {r['vs_ceiling']:.2f} | "
                  f"{r['vs_one_server']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
