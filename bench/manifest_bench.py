"""``Manifest.load`` time for a synthetic 100,000-shard manifest (goal: well under 1 s).

    /work/main/.venv/bin/python bench/manifest_bench.py [--shards 100000] [--repeats 5]
        [--batches 2]

Baseline in the same run: plain ``json.loads`` of the same file (the floor any validating
loader pays), so the ratio shows what validation and the consistency checks cost.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from stoker.manifest import Manifest, ShardInfo, stoker_version
from stoker.sharder.synthetic import tabular_schema


def build(n: int, batches: int) -> Manifest:
    """A valid manifest of ``n`` shards shaped like a real run (batch rows, arrow_bytes)."""
    batch_rows = (10302,) * batches
    shards = [ShardInfo(f"shards/{i:06d}.arrow", sum(batch_rows), 4_100_000 * batches + i,
                        f"{i:032x}", batch_rows, {"arrow_bytes": 4_194_304 * batches})
              for i in range(n)]
    sources = [{"path": f"part-{i:05d}.parquet", "bytes": 10**9, "xxh3_128": f"{i:032x}"}
               for i in range(min(n, 1000))]
    return Manifest.create(schema=tabular_schema(), shards=shards, sources=sources,
                           options={"rows_per_shard": 20000}, stoker_version=stoker_version())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", type=int, default=2,
                        help="record batches per shard (2 ~ 8 MB shards, 64 ~ 256 MB shards)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        build(args.shards, args.batches).save(tmp)
        path = Path(tmp) / "manifest.json"
        size = path.stat().st_size
        loads, plain = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            m = Manifest.load(tmp)
            _ = m.shard_rows  # what a loader touches first
            loads.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            json.loads(path.read_bytes())
            plain.append(time.perf_counter() - t0)
    med, base = statistics.median(loads), statistics.median(plain)
    print(f"machine: cpus={os.cpu_count()} python={platform.python_version()} "
          f"pyarrow={pa.__version__} stoker={stoker_version()}")
    print(f"manifest: {args.shards:,} shards x {args.batches} record batches, {size / 1e6:.1f} MB")
    print(f"Manifest.load + shard_rows  median {med:.3f} s  (runs: "
          f"{', '.join(f'{t:.3f}' for t in loads)})  goal < 1 s: {'met' if med < 1 else 'MISSED'}")
    print(f"json.loads (floor)          median {base:.3f} s  -> load costs {med / base:.2f}x "
          "the floor")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
