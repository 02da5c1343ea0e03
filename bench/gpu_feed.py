"""GPU feed benchmark: H2D throughput (pinned vs pageable) and copy/compute overlap.

``.venv/bin/python bench/gpu_feed.py`` on a machine with CUDA; without CUDA it says so and
exits 0. Three measurements, medians of ``--repeats``:

1. H2D copy throughput of one batch-sized buffer (``--mb``), pageable vs pinned memory, and
   pinned through stoker's ring (``stoker.loader.fastpath.ring.BufferRing(pin=True)``).
2. Copy/compute overlap: a matmul loop on the default stream alone, the copies alone, then
   both, with the copies on a side stream as ``stoker.loader.transfer.Transfer`` issues them.
   ``overlap = (compute + copy - both) / min(compute, copy)`` (1.0 = fully hidden).
3. End to end: a W1-shaped stoker dataset (``--rows``) read with ``device="cuda"``: batches/s
   with and without a compute step per batch, and the share of time the GPU waited for data.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def _median_time(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def h2d(mb: int, repeats: int) -> dict[str, float]:
    from stoker.loader.fastpath.ring import BufferRing

    n = mb * 2**20
    dst = torch.empty(n, dtype=torch.uint8, device="cuda")
    pageable = torch.ones(n, dtype=torch.uint8)
    pinned = torch.ones(n, dtype=torch.uint8).pin_memory()
    slot = BufferRing(2, pin=True).acquire()
    ring = torch.from_numpy(slot.array("x", (n,), np.uint8))
    out = {}
    for name, src in (("pageable", pageable), ("pinned", pinned), ("stoker ring", ring)):
        dst.copy_(src, non_blocking=True)
        t = _median_time(lambda s=src: dst.copy_(s, non_blocking=True), repeats)
        out[name] = n / t / 1e9
    return out


def overlap(mb: int, repeats: int) -> dict[str, float]:
    n = mb * 2**20
    host = torch.ones(n, dtype=torch.uint8).pin_memory()
    dst = torch.empty(n, dtype=torch.uint8, device="cuda")
    a = torch.randn(4096, 4096, device="cuda")
    side = torch.cuda.Stream()

    def compute() -> None:
        for _ in range(8):
            a @ a

    def copy() -> None:
        with torch.cuda.stream(side):
            for _ in range(8):
                dst.copy_(host, non_blocking=True)

    def both() -> None:
        copy()
        compute()

    tc, tm, tb = (_median_time(f, repeats) for f in (compute, copy, both))
    return {"compute_s": tc, "copy_s": tm, "both_s": tb,
            "overlap": (tc + tm - tb) / min(tc, tm)}


def end_to_end(rows: int) -> dict[str, float]:
    from stoker.loader import DataLoader
    from stoker.sharder import shard
    from stoker.sharder.synthetic import write_tabular_parquet

    work = Path(tempfile.mkdtemp(prefix="stoker-gpu-feed-"))
    write_tabular_parquet(work / "w1.parquet", rows)
    shard(str(work / "w1.parquet"), str(work / "ds"), progress=False)
    kw = {"batch_size": 1024, "shuffle": True, "seed": 0, "num_workers": 2,
          "features": [f"f{i}" for i in range(64)], "categoricals": [f"c{i}" for i in range(8)],
          "columns": ["seq", "label"], "device": "cuda"}
    w = torch.randn(64, 4096, device="cuda")
    out = {}
    for name, step in (("feed only", None), ("feed + compute", w)):
        dl = DataLoader(work / "ds", **kw)
        t = time.perf_counter()
        n = 0
        for b in dl:
            if step is not None:
                (b["features"] @ step).relu_().sum()
            n += 1
        torch.cuda.synchronize()
        out[f"{name} batches/s"] = n / (time.perf_counter() - t)
        out[f"{name} stall share"] = float(dl.stats.as_dict()["data_stall_share"] or 0.0)
        dl.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=64, help="bytes per copy, MiB")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--rows", type=int, default=500_000)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_feed: no CUDA device on this machine; nothing to measure.", file=sys.stderr)
        return 0
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}")
    print("H2D GB/s:", {k: round(v, 2) for k, v in h2d(args.mb, args.repeats).items()})
    print("overlap:", {k: round(v, 4) for k, v in overlap(args.mb, args.repeats).items()})
    print("end to end:", {k: round(v, 3) for k, v in end_to_end(args.rows).items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
