"""``stoker demo``: generate a synthetic tabular dataset, shard, verify and read it back."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "read_back", "run"]


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("demo", help="generate, shard, verify and read a small synthetic dataset",
                       description="End-to-end check on this machine: writes a synthetic tabular "
                       "Parquet file (64 float32, 8 int64, list<float32>[16], label), shards it, "
                       "verifies every shard and reads it all back, printing throughput.")
    p.add_argument("--rows", type=int, default=200_000, metavar="N", help="rows (default 200000)")
    p.add_argument("--dir", metavar="D", help="keep the files in D (default: a temp dir, removed)")
    # One in-process worker by default: a process pool costs ~0.5-1.5 s to start, more
    # than sharding the default 200,000 rows takes.
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="sharding processes (default 1)")
    p.add_argument("--seed", type=int, default=0, help="data seed (default 0)")
    return p


def read_back(dataset: str | os.PathLike[str]) -> tuple[int, int]:
    """Read every shard into NumPy (memory-mapped Arrow IPC); return (rows, bytes) read.

    The one reading step of the demo: it will use ``stoker.loader.DataLoader`` once it exists.
    """
    import pyarrow as pa

    from stoker.manifest import Manifest

    manifest = Manifest.load(dataset)
    rows = nbytes = 0
    for i in range(manifest.num_shards):
        with pa.memory_map(manifest.shard_location(i)) as source:
            reader = pa.ipc.open_file(source)
            for b in range(reader.num_record_batches):
                batch = reader.get_batch(b)
                for column in batch.columns:
                    values = column.flatten() if pa.types.is_list(column.type) else column
                    nbytes += values.to_numpy(zero_copy_only=False).nbytes
                rows += batch.num_rows
    return rows, nbytes


def run(args: argparse.Namespace) -> int:
    from stoker.sharder import format_size, shard
    from stoker.sharder.synthetic import write_tabular_parquet
    from stoker.tools.cli import UsageError
    from stoker.tools.cmd_verify import find_mismatches

    if args.rows < 1:
        raise UsageError(f"--rows {args.rows} must be at least 1.")
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="stoker-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    source, dataset = root / "source.parquet", root / "stoker-demo-dataset"
    try:
        t0 = time.perf_counter()
        write_tabular_parquet(source, args.rows, args.seed)
        source_bytes = os.path.getsize(source)
        t1 = time.perf_counter()
        manifest = shard(source, dataset, overwrite=True, workers=args.workers,
                         shard_size="16MB", progress=None)
        t2 = time.perf_counter()
        problems = find_mismatches(manifest)
        t3 = time.perf_counter()
        rows, nbytes = read_back(dataset)
        t4 = time.perf_counter()
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    size = int(manifest.shard_bytes.sum())
    print(f"stoker demo: {args.rows:,} rows x {len(manifest.fields)} columns "
          f"(seed {args.seed}) in {root}{'' if args.dir else ' (removed)'}")
    print(f"  generate  {t1 - t0:6.2f} s  Parquet {format_size(source_bytes)}")
    print(f"  shard     {t2 - t1:6.2f} s  {manifest.num_shards} shards, {format_size(size)}, "
          f"{args.rows / (t2 - t1):,.0f} rows/s, {size / 1e6 / (t2 - t1):,.0f} MB/s "
          f"({args.workers} worker(s))")
    status = "OK" if not problems else f"{len(problems)} MISMATCHES"
    print(f"  verify    {t3 - t2:6.2f} s  {status}, {size / 1e6 / (t3 - t2):,.0f} MB/s")
    print(f"  read      {t4 - t3:6.2f} s  {rows:,} rows into NumPy, "
          f"{rows / (t4 - t3):,.0f} rows/s, {nbytes / 1e6 / (t4 - t3):,.0f} MB/s")
    print(f"  fingerprint {manifest.fingerprint}")
    for line in problems:
        print(f"MISMATCH {line}", file=sys.stderr)
    return 1 if problems or rows != args.rows else 0
