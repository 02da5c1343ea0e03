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
import resource
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


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn: Callable[[Path], None], work: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one run into a fresh folder.

    CPU counts this process and its reaped children; process-pool workers started by a
    forkserver are not our children, so CPU is reported for single-process runs only.
    """
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    cpu, start = _cpu(), time.perf_counter()
    fn(out)
    wall = time.perf_counter() - start
    cpu = _cpu() - cpu
    shutil.rmtree(out, ignore_errors=True)
    return wall, cpu


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
        contenders: dict[str, Callable[[Path], None]] = {"ceiling": lambda out: ceiling(src, out)}
        for workers in (int(w) for w in args.workers.split(",")):
            contenders[f"stoker workers={workers}"] = (
                lambda out, w=workers: shard(src, out, workers=w, compression=args.compression,
                                             progress=False))
        for fn in contenders.values():  # warm-up: page cache, allocator, forkserver imports
            timed(fn, work)
        walls: dict[str, list[float]] = {name: [] for name in contenders}
        cpus: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(args.repeats):  # interleaved, so load from elsewhere hits all alike
            for name, fn in contenders.items():
                wall, cpu = timed(fn, work)
                walls[name].append(wall)
                cpus[name].append(cpu)
        base, base_cpu = statistics.median(walls["ceiling"]), statistics.median(cpus["ceiling"])
        report = []
        for name in contenders:
            med, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
            row = {"name": name, "median_s": round(med, 3),
                   "times_s": [round(t, 3) for t in walls[name]], "median_cpu_s": round(cpu, 3),
                   "rows_per_s": round(args.rows / med),
                   "mb_per_s": round(arrow_bytes / 1e6 / med, 1),
                   "ratio_vs_ceiling": round(base / med, 3),
                   "cpu_ratio_vs_ceiling": round(base_cpu / cpu, 3)}
            if "workers=1" not in name and name != "ceiling":
                row["median_cpu_s"] = row["cpu_ratio_vs_ceiling"] = None
            report.append(row)
            cpu_text = (f"cpu {cpu:6.3f} s {base_cpu / cpu:.2f}x" if row["median_cpu_s"]
                        else "cpu    n/a        ")
            print(f"{name:18s} wall {med:6.3f} s {row['rows_per_s']:>10,} rows/s "
                  f"{row['mb_per_s']:7.1f} MB/s {row['ratio_vs_ceiling']:.2f}x of ceiling | "
                  f"{cpu_text} | runs {', '.join(f'{t:.2f}' for t in walls[name])}")
        if args.json:
            Path(args.json).write_text(json.dumps({"rows": args.rows, "machine": machine(),
                                                   "results": report}, indent=1))
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
