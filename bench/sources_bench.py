"""Sharding engines and indexing: local pool (1, 2 workers) and Dask vs the single-process
ceiling; ``stoker index`` over 1,000 small Parquet files vs reading their footers + hashing.

    /work/main/.venv/bin/python bench/sources_bench.py                  # 1,000,000 rows
    /work/main/.venv/bin/python bench/sources_bench.py --rows 200000 --repeats 2   # smoke run

Part 1 input: the synthetic tabular dataset (``stoker.sharder.synthetic``) as one snappy
Parquet file, sharded into 64 MB shards (so there are several tasks to spread). Ceiling = one
process, ``pq.read_table`` + one Arrow IPC file written (no hashing, fsync or manifest).
"Dask, cluster per run" includes starting and closing a 2-worker ``LocalCluster``; "Dask,
running cluster" submits to one started beforehand (a cluster's steady state).
Part 3 (run before part 2): WebDataset tars (``--tars`` x ``--samples`` samples of a ~16 KB
binary payload + ``cls`` + ``txt``) sharded into 32 MB shards; ceiling = one process iterating
the samples with the ``webdataset`` package and writing one Arrow IPC file.
Part 2: 1,000 Parquet files of 100 rows (4 columns); baseline = for each file, open the
footer and xxh3 the bytes (the least an index must do); also ``stoker shard`` of the same files.
Contenders are interleaved in every repeat; medians are reported.
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

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from stoker.manifest import hash_file, stoker_version
from stoker.sharder import shard
from stoker.sharder.index import index
from stoker.sharder.sources.tar_layout import _CACHE as _LAYOUTS
from stoker.sharder.synthetic import write_tabular_parquet


def ceiling(src: Path, out: Path) -> None:
    table = pq.read_table(src)
    with pa.OSFile(str(out / "all.arrow"), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)


def tar_ceiling(tars: list[Path], out: Path) -> None:
    import webdataset as wds

    schema = pa.schema([("__key__", pa.string()), ("cls", pa.int64()), ("jpg", pa.binary()),
                        ("txt", pa.string())])
    with pa.OSFile(str(out / "all.arrow"), "wb") as f, pa.ipc.new_file(f, schema) as w:
        for tar in tars:
            rows = list(wds.WebDataset(str(tar), shardshuffle=False, empty_check=False))
            w.write_table(pa.table({"__key__": [r["__key__"] for r in rows],
                                    "cls": [int(r["cls"]) for r in rows],
                                    "jpg": [r["jpg"] for r in rows],
                                    "txt": [r["txt"].decode() for r in rows]}, schema=schema))


def write_bench_tars(root: Path, tars: int, samples: int) -> list[Path]:
    import io
    import tarfile

    rng = np.random.default_rng(0)
    root.mkdir()
    paths = []
    for t in range(tars):
        path = root / f"part-{t:04d}.tar"
        with tarfile.open(path, "w") as tar:
            for i in range(samples):
                key = f"s{t * samples + i:09d}"
                for ext, data in (("jpg", rng.bytes(16000)), ("cls", str(i % 10).encode()),
                                  ("txt", f"caption {i}".encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


def footers_and_hashes(files: list[Path], out: Path) -> None:
    for f in files:
        pq.ParquetFile(f).metadata
        hash_file(f)


def timed(fn: Callable[[Path], None], work: Path) -> float:
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    start = time.perf_counter()
    fn(out)
    wall = time.perf_counter() - start
    shutil.rmtree(out, ignore_errors=True)
    return wall


def machine() -> dict[str, object]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "pyarrow": pa.__version__, "stoker": stoker_version(),
            "load_avg": [round(x, 1) for x in os.getloadavg()], "platform": platform.platform()}


def run(contenders: dict[str, Callable[[Path], None]], work: Path, repeats: int,
        baseline: str, unit: float, unit_name: str) -> list[dict[str, object]]:
    for fn in contenders.values():  # warm-up: page cache, imports, forkserver
        timed(fn, work)
    walls: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            walls[name].append(timed(fn, work))
    base = statistics.median(walls[baseline])
    report = []
    for name in contenders:
        med = statistics.median(walls[name])
        row = {"name": name, "median_s": round(med, 3), "times_s": [round(t, 3) for t in walls[name]],
               f"{unit_name}_per_s": round(unit / med, 1), "ratio_vs_baseline": round(base / med, 3)}
        report.append(row)
        print(f"  {name:34s} {med:7.3f} s  {unit / med:12,.1f} {unit_name}/s  "
              f"{base / med:5.2f}x of {baseline} | runs {', '.join(f'{t:.2f}' for t in walls[name])}")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--tars", type=int, default=8)
    parser.add_argument("--samples", type=int, default=1000, help="samples per tar")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    from distributed import Client, LocalCluster

    from stoker.sharder.executor_dask import DaskExecutor

    work = Path(tempfile.mkdtemp(prefix="stoker-sources-bench-"))
    cluster = client = None
    try:
        src = work / "input.parquet"
        write_tabular_parquet(src, args.rows, seed=0)
        mb = pq.read_table(src).nbytes / 1e6
        print(f"machine: {json.dumps(machine())}")
        print(f"part 1: {args.rows:,} rows, Arrow {mb:.1f} MB, 64 MB shards")
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                               dashboard_address="127.0.0.1:0", host="127.0.0.1")
        client = Client(cluster)
        address = cluster.scheduler_address

        def sharded(**kw: object) -> Callable[[Path], None]:
            return lambda out: shard(src, out / "ds", shard_size="64MB", progress=False, **kw)

        part1 = run({"ceiling (1 process)": lambda out: ceiling(src, out),
                     "stoker local, 1 worker": sharded(workers=1),
                     "stoker local, 2 workers": sharded(workers=2),
                     "stoker dask, cluster per run (2)": lambda out: sharded(
                         executor=DaskExecutor(workers=2))(out),
                     "stoker dask, running cluster (2)": lambda out: sharded(
                         executor=DaskExecutor(address))(out)},
                    work, args.repeats, "ceiling (1 process)", mb, "MB")
        tars = write_bench_tars(work / "tars", args.tars, args.samples)
        tar_mb = sum(p.stat().st_size for p in tars) / 1e6
        print(f"part 3: {args.tars} tars x {args.samples} samples, {tar_mb:.1f} MB, 32 MB shards")

        def tar_sharded(**kw: object) -> Callable[[Path], None]:
            def go(out: Path) -> None:
                _LAYOUTS.clear()  # a fresh process would scan the tar headers again
                shard(work / "tars", out / "ds", shard_size="32MB", progress=False, **kw)
            return go

        part3 = run({"ceiling (webdataset, 1 process)": lambda out: tar_ceiling(tars, out),
                     "stoker local, 1 worker": tar_sharded(workers=1),
                     "stoker local, 2 workers": tar_sharded(workers=2),
                     "stoker dask, running cluster (2)": lambda out: tar_sharded(
                         executor=DaskExecutor(address))(out)},
                    work, args.repeats, "ceiling (webdataset, 1 process)", tar_mb, "MB")
        client.close()
        cluster.close()
        client = cluster = None

        small = work / "small"
        small.mkdir()
        rng = np.random.default_rng(0)
        for i in range(args.files):
            pq.write_table(pa.table({"id": np.arange(i * 100, i * 100 + 100),
                                     "x": rng.standard_normal(100).astype(np.float32),
                                     "y": rng.integers(0, 9, 100), "s": [f"r{i}"] * 100}),
                           small / f"part-{i:05d}.parquet")
        files = sorted(small.iterdir())

        def indexed(workers: int) -> Callable[[Path], None]:
            def go(out: Path) -> None:
                index(small, overwrite=True, workers=workers)
            return go

        print(f"part 2: {args.files} Parquet files x 100 rows")
        part2 = run({"footers + xxh3 (baseline)": lambda out: footers_and_hashes(files, out),
                     "stoker index, 1 worker": indexed(1),
                     "stoker index, 2 workers": indexed(2),
                     "stoker shard (rewrite), 1 worker": lambda out: shard(
                         small, out / "ds", format="parquet", progress=False)},
                    work, args.repeats, "footers + xxh3 (baseline)", args.files, "files")
        if args.json:
            Path(args.json).write_text(json.dumps({"machine": machine(), "rows": args.rows,
                                                   "files": args.files, "engines": part1,
                                                   "webdataset": part3,
                                                   "index": part2}, indent=1))
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
