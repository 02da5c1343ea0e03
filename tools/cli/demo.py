"""``stoker demo``: generate a synthetic tabular dataset, shard, verify and read it back."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ReadResult", "add_parser", "read_back", "run"]


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


@dataclass(frozen=True)
class ReadResult:
    """What the demo's read step measured."""

    rows: int
    nbytes: int
    seconds: float
    stats: dict[str, Any]
    resume_exact: bool
    resume_at: int
    batches: int


def read_back(dataset: str | os.PathLike[str], seed: int) -> ReadResult:
    """Read one shuffled epoch with ``stoker.loader.DataLoader``, then prove exact resume.

    The epoch is read with 2 worker threads into ``features`` [B, 64] float32,
    ``categoricals`` [B, 8] int64, ``seq`` [B, 16] float32 and ``label`` [B] int64. Then a new
    loader stops half way, saves its state, and a third loader with no workers continues
    from it: the batch digests must equal the uninterrupted epoch's.
    """
    import xxhash

    from stoker.loader import DataLoader, ReadOptions

    kw: dict[str, Any] = dict(
        batch_size=1024, shuffle=True, seed=seed, columns=["seq", "label"],
        read=ReadOptions(features=[f"f{i}" for i in range(64)],
                         categoricals=[f"c{i}" for i in range(8)]))

    def digest(batch: dict[str, Any]) -> str:
        h = xxhash.xxh3_64()
        for key in ("features", "categoricals", "seq", "label"):
            h.update(batch[key].numpy().tobytes())
        return h.hexdigest()

    loader = DataLoader(dataset, num_workers=2, **kw)
    rows = nbytes = 0
    digests = []
    t0 = time.perf_counter()
    for batch in loader:
        rows += len(batch["label"])
        nbytes += sum(batch[k].numel() * batch[k].element_size()
                      for k in ("features", "categoricals", "seq", "label"))
        digests.append(digest(batch))
    seconds = time.perf_counter() - t0
    stats = loader.stats.as_dict()
    loader.close()

    half = len(digests) // 2
    first = DataLoader(dataset, num_workers=2, **kw)
    it = iter(first)
    before = [digest(next(it)) for _ in range(half)]
    state = first.state_dict()
    first.close()
    second = DataLoader(dataset, num_workers=0, **kw)
    second.load_state_dict(state)
    after = [digest(b) for b in second]
    second.close()
    return ReadResult(rows, nbytes, seconds, stats, before + after == digests, half, len(digests))


def run(args: argparse.Namespace) -> int:
    import stoker.loader.dataloader  # noqa: F401 - Numba starts up while the data is made
    from stoker.sharder import format_size, shard
    from stoker.sharder.synthetic import write_tabular_parquet
    from stoker.tools.cli import UsageError
    from stoker.tools.cli.verify import find_mismatches

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
        read = read_back(dataset, args.seed)
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
    print(f"  read      {read.seconds:6.2f} s  {read.rows:,} rows, shuffled, into batch tensors "
          f"with stoker.loader.DataLoader: {read.rows / read.seconds:,.0f} rows/s, "
          f"{read.nbytes / 1e6 / read.seconds:,.0f} MB/s, first batch "
          f"{(read.stats['first_batch_s'] or 0) * 1e3:.0f} ms, "
          f"data stall {read.stats['data_stall_share']:.0%}")
    cold = read.stats["fallbacks"].get("compiling", 0)
    if cold:
        print(f"            ({cold} batches were read by NumPy twins while stoker's Numba kernels "
              "compiled (once per machine) or loaded in the background; the demo exits when "
              "they are cached. Run `stoker demo` again for steady-state figures)")
    verdict = "exact" if read.resume_exact else "MISMATCH"
    print(f"  resume    {verdict}: stopped after batch {read.resume_at} of {read.batches}, "
          "saved state_dict(), continued with another worker count")
    print(f"  fingerprint {manifest.fingerprint}")
    for line in problems:
        print(f"MISMATCH {line}", file=sys.stderr)
    return 1 if problems or read.rows != args.rows or not read.resume_exact else 0
