"""Sharding throughput: ``stoker.sharder.shard`` vs the ceiling "pyarrow reads the Parquet and
writes it as one Arrow IPC file", side by side in one process, medians over repeats.

    /work/main/.venv/bin/python bench/shard_bench.py                 # 2,000,000 rows
    /work/main/.venv/bin/python bench/shard_bench.py --rows 200000 --repeats 3   # smoke run

The input is the synthetic tabular dataset (``stoker.sharder.synthetic``: 64 float32, 8 int64,
list<float32>[16], int64 label), written once as snappy Parquet with 65,536-row row groups.
MB/s counts uncompressed Arrow bytes of the table (``Table.nbytes``) per second.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from stoker.manifest import stoker_version
from stoker.sharder import shard
from stoker.sharder.synthetic import write_tabular_parquet


def ceiling(src: Path, out: Path) -> None:
    """The baseline: one pyarrow read of the Parquet, one Arrow IPC file written."""
    table = pq.read_table(src)
    with pa.OSFile(str(out / "all.arrow"), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)


def timed(fn: Callable[[Path], None], work: Path, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        out = work / "out"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        start = time.perf_counter()
        fn(out)
        times.append(time.perf_counter() - start)
    shutil.rmtree(work / "out", ignore_errors=True)
    return times


def machine() -> dict[str, object]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "pyarrow": pa.__version__, "stoker": stoker_version(),
            "platform": platform.platform(), "processor": platform.processor() or "?"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    parser.add_argument("--compression", default="none", choices=("none", "zstd"))
    parser.add_argument("--dir", help="work directory (default: a temp dir)")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    work = Path(args.dir or tempfile.mkdtemp(prefix="stoker-shard-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / "input.parquet"
    try:
        t0 = time.perf_counter()
        write_tabular_parquet(src, args.rows, seed=0)
        gen = time.perf_counter() - t0
        arrow_bytes = pq.read_table(src).nbytes
        print(f"input: {args.rows:,} rows, Parquet {src.stat().st_size / 1e6:.1f} MB, "
              f"Arrow {arrow_bytes / 1e6:.1f} MB (generated in {gen:.1f} s)")
        print(f"machine: {json.dumps(machine())}")
        ceiling(src, work)  # warm the page cache and pyarrow's allocator
        results = {"ceiling": timed(lambda out: ceiling(src, out), work, args.repeats)}
        for workers in (int(w) for w in args.workers.split(",")):
            results[f"stoker workers={workers}"] = timed(
                lambda out, w=workers: shard(src, out, workers=w, overwrite=True,
                                             compression=args.compression, progress=False),
                work, args.repeats)
        base = statistics.median(results["ceiling"])
        report = []
        for name, times in results.items():
            med = statistics.median(times)
            row = {"name": name, "median_s": round(med, 3), "times_s": [round(t, 3) for t in times],
                   "rows_per_s": round(args.rows / med), "mb_per_s": round(arrow_bytes / 1e6 / med, 1),
                   "ratio_vs_ceiling": round(base / med, 3)}
            report.append(row)
            print(f"{name:20s} median {med:7.3f} s  {row['rows_per_s']:>12,} rows/s  "
                  f"{row['mb_per_s']:8.1f} MB/s  {row['ratio_vs_ceiling']:.2f}x of ceiling  "
                  f"(runs: {', '.join(f'{t:.3f}' for t in times)})")
        if args.json:
            Path(args.json).write_text(json.dumps({"rows": args.rows, "machine": machine(),
                                                   "results": report}, indent=1))
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
