"""What checking stored row-major records against their shard costs per shard open.

When a process maps a stored record file it did not write, it recomputes the first, the last
and ``SAMPLE_ROWS`` random rows from the shard's columns and compares them byte for byte
(:mod:`stoker.loader.fastpath.record_check`). This measures, on one W1 shard (64 float32
features, 8 int64 categoricals, list<float32>[16], int64 label; the sharder's default 256 MB
shard), the three things a shard open may cost, each the median of ``--repeats`` runs:

* **open**: the shard's kernel inputs (:class:`~stoker.loader.fastpath.plan.ShardData`), paid
  by every open whatever happens next;
* **map**: :meth:`RecordStore.open <stoker.loader.fastpath.record_store.RecordStore.open>`,
  mapping the file and verifying its trailing xxh3-128 (page cache warm);
* **check** at several sample sizes, on a freshly opened shard each time (so the column
  metadata the check needs is computed inside the measurement, as in a real open);
* **build**: :func:`stoker.loader.fastpath.rowmajor.build`, what a process without a stored
  file pays (kernels compiled before the measurement).

    .venv/bin/python bench/records_check_bench.py [--rows 600000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from stoker.loader.fastpath import record_check, rowmajor
from stoker.loader.fastpath.plan import FastPlan, ShardData
from stoker.loader.fastpath.record_store import RecordStore

sys.path.insert(0, str(Path(__file__).resolve().parent))

import loader_bench as lb  # noqa: E402 - W1's data and outputs

FEATURES, CATS = lb.FEATURES, lb.CATS
SAMPLES = (64, 256, 1024)


def open_shard(path: Path, plan: FastPlan) -> tuple[ShardData, list[pa.RecordBatch]]:
    """The shard as the loader opens it (stoker.loader.read.open_shards)."""
    source = pa.memory_map(str(path), "r")
    arena = source.read_buffer(source.size())
    batches = pa.ipc.open_file(arena).read_all().to_batches()
    return ShardData(batches, arena, plan.kernel_columns), batches


def _median_ms(fn: Callable[[], Any], repeats: int) -> float:
    return lb.median_seconds(fn, repeats) * 1e3


def run(rows: int, repeats: int, workdir: Path) -> str:
    from stoker.manifest import Manifest

    root = lb.build_w1(workdir, rows) / "stoker"
    m = Manifest.load(str(root))
    path = root / m.shards[0].path
    plan = FastPlan(m.arrow_schema, [*FEATURES, *CATS, "seq", "label"], FEATURES, CATS)
    data, batches = open_shard(path, plan)
    layout = rowmajor.RecordLayout.of(plan, batches)
    assert layout is not None
    misfits = layout.misfits(batches)
    shard_rows = int(data.starts[-1])
    rowmajor.build(layout, data, misfits)  # compile (or load) the kernels first
    built = rowmajor.build(layout, data, misfits)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        store = RecordStore(tmp)
        name = store.name(m.shards[0].xxh3_128, shard_rows, layout.key(misfits))
        store.save(name, built)
        mapped = store.open(name, built.nbytes)
        assert mapped is not None
        records = mapped.reshape(built.shape)
        assert record_check.first_mismatch(layout, data, records, misfits,
                                           np.arange(shard_rows)) is None  # every row agrees
        t_open = _median_ms(lambda: open_shard(path, plan), repeats)
        t_map = _median_ms(lambda: store.open(name, built.nbytes), repeats)
        checks = {}
        for k in SAMPLES:
            fresh = [open_shard(path, plan)[0] for _ in range(repeats)]
            it = iter(fresh)
            checks[k] = _median_ms(lambda: record_check.first_mismatch(
                layout, data=next(it), records=records, skip=misfits,
                rows=record_check.sample_rows(shard_rows, k)), repeats)
        t_build = _median_ms(lambda: rowmajor.build(layout, data, misfits), max(3, repeats // 2))
    lines = [f"`.venv/bin/python bench/records_check_bench.py --rows {rows} --repeats {repeats}` "
             f"on {platform.machine()}, {os.cpu_count()} CPUs: one W1 shard of {shard_rows:,} "
             f"rows ({path.stat().st_size / 1e6:.0f} MB, {len(batches)} record batches), "
             f"{built.nbytes / 1e6:.0f} MB of records (stride {layout.stride} B); ms per shard "
             "open, medians.", "",
             "| step | ms | vs map |", "|---|---:|---:|",
             f"| open the shard (ShardData) | {t_open:.2f} | {t_open / t_map:.3f} |",
             f"| map + verify the record file (xxh3-128) | {t_map:.2f} | 1.000 |"]
    for k, t in checks.items():
        lines.append(f"| check first, last + {k} random rows | {t:.2f} | {t / t_map:.3f} |")
    lines.append(f"| build the records from the columns | {t_build:.2f} | {t_build / t_map:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=600_000, help="rows of the W1 shard")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--workdir", type=Path,
                        default=Path(tempfile.gettempdir()) / "stoker-bench")
    args = parser.parse_args(argv)
    print(run(args.rows, args.repeats, args.workdir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
