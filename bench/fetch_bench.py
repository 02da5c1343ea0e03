"""Fetch amplification: bytes a real HTTP server sends per epoch, against the dataset's bytes,
for cache limits below, at and above the order's working set (issue 12).

One command (``.venv/bin/python bench/fetch_bench.py [--rows 200000] [--shards 40]
[--epochs 3]``) builds a W1 dataset of ``--shards`` shards (bench/loader_bench.py's
generator), serves it from the loopback HTTP server the tests use (tests/servers/fault_server.py:
byte ranges, ETags, a log of every byte it sent), and reads ``--epochs`` shuffled epochs
through a DataLoader with a node cache limited to a multiple of the working set
(``loader._order_plan.working_set.shard_bytes``, what the loader computes from the order
options, the world and the workers), with 2 thread workers and 2 process workers. A limit
below the working set is refused when the loader is built (``WorkingSetError``); the table
says so instead of a ratio. Bytes are counted by the server, from the shard requests only
(the manifest is fetched once). The default order options are used except the partitions
(``--partitions``, default 4: with the default P the working set of a 40-shard dataset is
the whole dataset, and no limit below the dataset could be shown).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "servers"))

import loader_bench as lb  # noqa: E402
from fault_server import FaultServer  # noqa: E402

FACTORS = (0.5, 1.0, 1.5, 3.0)  # cache limit / working set


def _sent(server: FaultServer) -> int:
    return sum(r.sent for r in server.requests() if "/stoker/" in r.path and
               not r.path.endswith("manifest.json"))


def _case(server: FaultServer, url: str, dataset_bytes: int, limit: int, mode: str,
          epochs: int, partitions: int, cache: Path) -> str:
    from stoker.loader import CacheOptions, DataLoader, ReadOptions, ShuffleOptions, WorkerOptions
    from stoker.loader.read.order_plan import WorkingSetError

    shutil.rmtree(cache, ignore_errors=True)
    try:
        loader = DataLoader(url, batch_size=1024, shuffle=ShuffleOptions(partitions=partitions),
                            seed=0, columns=["label"], num_workers=2,
                            workers=WorkerOptions(mode=mode),
                            read=ReadOptions(features=["f0"], row_major=False),
                            cache=CacheOptions(dir=cache, limit=limit))
    except WorkingSetError:
        return "refused at construction"
    per_epoch = []
    try:
        for epoch in range(epochs):
            before = _sent(server)
            loader.set_epoch(epoch)
            for _ in loader:
                pass
            per_epoch.append((_sent(server) - before) / dataset_bytes)
    finally:
        loader.close()
    return " / ".join(f"{r:.2f}x" for r in per_epoch)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--shards", type=int, default=40)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--workdir", default=None)
    args = p.parse_args(argv)
    from stoker.loader import DataLoader, ShuffleOptions, WorkerOptions
    from stoker.manifest import Manifest
    from stoker.sharder import shard
    from stoker.sharder.synthetic import write_tabular_parquet

    work = Path(args.workdir or tempfile.mkdtemp(prefix="stoker-fetch-bench-"))
    data = work / f"w1-{args.rows}-{args.shards}"
    if not (data / "stoker" / "manifest.json").exists():
        data.mkdir(parents=True, exist_ok=True)
        write_tabular_parquet(data / "data.parquet", args.rows)
        shard(str(data / "data.parquet"), str(data / "stoker"), progress=False, overwrite=True,
              rows_per_shard=-(-args.rows // args.shards))
    manifest = Manifest.load(str(data / "stoker"))
    dataset_bytes = int(manifest.shard_bytes.sum())
    rows = []
    with FaultServer() as server:
        server.put_dir(data / "stoker", "stoker")
        url = f"{server.url}/stoker"
        sets = {}
        for mode in ("thread", "process"):  # process workers' windows add to the loader's
            probe = DataLoader(str(data / "stoker"), batch_size=1024, num_workers=2,
                               workers=WorkerOptions(mode=mode),
                               shuffle=ShuffleOptions(partitions=args.partitions))
            sets[mode] = probe._order_plan.working_set
            probe.close()
        for factor in FACTORS:
            for mode, ws in sets.items():
                limit = int(ws.shard_bytes * factor)
                got = _case(server, url, dataset_bytes, limit, mode, args.epochs,
                            args.partitions, work / "cache")
                print(f"limit {factor:.1f}x working set, {mode}: {got}", flush=True)
                rows.append((factor, limit, mode, got))
    print(f"\n`.venv/bin/python bench/fetch_bench.py --rows {args.rows} --shards {args.shards} "
          f"--epochs {args.epochs} --partitions {args.partitions}` — {platform.machine()}, "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}; W1, {manifest.num_shards} "
          f"shards, {dataset_bytes:,} bytes; working set (P={args.partitions}): "
          + "; ".join(f"2 {m} workers {w.shards} shards, {w.shard_bytes:,} bytes"
                      for m, w in sets.items()) + "; batch 1024, shuffled; one run, each "
          "epoch's bytes shown.\n")
    print("| cache limit | bytes | workers | server bytes per epoch / dataset bytes |")
    print("|---|---:|---|---|")
    for factor, limit, mode, got in rows:
        print(f"| {factor:.1f}x working set | {limit:,} | 2 {mode} | {got} |")
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
