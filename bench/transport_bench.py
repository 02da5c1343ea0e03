"""How fast a worker process hands batches to the consumer: the pipe vs the shared-memory ring.

Run (the command behind bench/RESULTS.md, "Worker hand-over"):

    .venv/bin/python bench/transport_bench.py --batches 3000 --repeats 5

A forked process sends the same batch over and over, at most
:data:`~stoker.loader.workers.transport.IN_FLIGHT` unread at a time (as the process pool
hands out work), as stoker's pipe message (``dumps``, tensors as bytes), through a
:class:`~stoker.loader.workers.transport.Ring` whose slots the consumer copies out of, and
through one that lends them (the batch's tensors view the slot until the consumer drops them,
as a training loop does by its next step), the batch pickled into the slot ("lent, pickled")
or, as the loader's workers send a stoker batch (a ``Delivered`` answer of plain tensors,
``Ring``'s plain answers since session 15), copied in with only its layout pickled ("lent");
the consumer rebuilds every batch. Reported:
batches/s and the consumer's CPU per batch, medians over alternating repeats, for a W1 batch
(1024 rows: features [1024, 64] f32, categoricals [1024, 8] i64, seq [1024, 16] f32, label) and
a W2 batch (256 images 64x64x3 uint8, label).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import statistics
import time
from typing import Any, Callable

import torch
import torch.multiprocessing  # noqa: F401 - torch's reductions, as in the loader's workers
from multiprocessing.reduction import ForkingPickler

from stoker.loader.epoch_iter import Delivered
from stoker.loader.workers.transport import IN_FLIGHT, LEASES, Ring, dumps


def w1() -> dict[str, torch.Tensor]:
    return {"features": torch.rand(1024, 64), "categoricals": torch.randint(0, 9, (1024, 8)),
            "seq": torch.rand(1024, 16), "label": torch.arange(1024)}


def w2() -> dict[str, torch.Tensor]:
    return {"image": torch.randint(0, 255, (256, 64, 64, 3), dtype=torch.uint8),
            "label": torch.arange(256)}


def _send(conn: Any, ring: Ring | None, credit: Any, done: Any, make: Callable[[], Any],
          n: int, plain: bool) -> None:
    batch = Delivered(make(), None, {}) if plain else make()
    for i in range(n):
        credit.acquire()
        conn.send_bytes(dumps((i, batch)) if ring is None else ring.put((i, batch)))
    conn.close()
    done.wait()  # torch's shared tensors are fetched from this process: stay until read


MODES = ("pipe", "ring, copied", "ring, lent, pickled", "ring, lent")


def run(make: Callable[[], Any], n: int, mode: str) -> tuple[float, float]:
    """(batches/s, consumer CPU us per batch) for one sender process."""
    ctx = mp.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    ring = None if mode == "pipe" else Ring(leases=LEASES if "lent" in mode else 0)
    credit, done = ctx.Semaphore(IN_FLIGHT), ctx.Event()
    sender = ctx.Process(target=_send, args=(send, ring, credit, done, make, n,
                                             mode == "ring, lent"))
    sender.start()
    send.close()
    loads = ForkingPickler.loads if ring is None else ring.loads
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        loads(receive.recv_bytes())
        credit.release()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    done.set()
    sender.join()
    if ring is not None:
        ring.close()
    return n / wall, cpu / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=3000)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f}; medians of {args.repeats} alternating runs "
          f"of {args.batches} batches")
    print("| batch | hand-over | batches/s | ratio to pipe | consumer CPU per batch |")
    print("|---|---|---:|---:|---:|")
    for name, make in (("W1 (400 KB)", w1), ("W2 (3.1 MB)", w2)):
        got: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
        for _ in range(args.repeats):
            for mode in MODES:
                got[mode].append(run(make, args.batches, mode))
        rate = {k: statistics.median(r for r, _ in v) for k, v in got.items()}
        cpu = {k: statistics.median(c for _, c in v) for k, v in got.items()}
        for mode in MODES:
            print(f"| {name} | {mode} | {rate[mode]:,.0f} | {rate[mode] / rate['pipe']:.1f}x | "
                  f"{cpu[mode]:.0f} us |")
    print(f"# load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
