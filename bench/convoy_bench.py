"""A background thread's NumPy work beside a thread running Python: the GIL convoy.

``.venv/bin/python bench/convoy_bench.py [--repeats 5]`` transposes one decoded 65,536-row
W1 row group into row-major records with ``plain_records`` (what an indexed Parquet dataset's
decode thread does for every row group, stoker.loader.read.indexed.row_groups), alone and while
another thread spins in Python (a training loop's Python, the consumer's), with tiles of 500
rows (stoker's: no column copy gives the GIL up) and of 668 rows (the tile stoker used
before: 256 KiB of 392-byte records). NumPy gives the GIL up for a copy of more than 500
elements and must then wait to take it back, up to a switch interval (5 ms), behind the other
thread. Reports the median ms per group of each case and the machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loader_bench import CATS, FEATURES, median_seconds  # noqa: E402

ROWS = 65_536  # bench/scale_bench.py's row groups


def w1_group(rows: int = ROWS) -> tuple[pa.RecordBatch, object]:
    """One W1 row group (the synthetic table every W1 benchmark reads) and its record layout."""
    from stoker.loader.fastpath.plan import FastPlan
    from stoker.loader.fastpath.rowmajor import RecordLayout
    from stoker.sharder.synthetic import make_tabular_table

    (batch,) = make_tabular_table(rows).to_batches()
    plan = FastPlan(batch.schema, ["seq", "label"], FEATURES, CATS)
    return batch, RecordLayout.of(plan, [batch])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    from stoker.loader.read.indexed import row_groups

    batch, layout = w1_group()
    spinning = threading.Event()

    def spin() -> None:
        while spinning.is_set():
            pass

    ours = row_groups._TILE_ROWS
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"NumPy {np.__version__}; {ROWS:,}-row W1 group, median of {args.repeats}")
    print("| tile rows | alone (ms) | beside a thread running Python (ms) | slowdown |")
    print("|---:|---:|---:|---:|")
    for tile in (ours, 668):
        row_groups._TILE_ROWS = tile
        alone = median_seconds(lambda: row_groups.plain_records(batch, layout), args.repeats)
        spinning.set()
        other = threading.Thread(target=spin, daemon=True)
        other.start()
        try:
            busy = median_seconds(lambda: row_groups.plain_records(batch, layout), args.repeats)
        finally:
            spinning.clear()
            other.join()
        print(f"| {tile} | {alone * 1e3:.1f} | {busy * 1e3:.1f} | {busy / alone:.1f}x |")
    row_groups._TILE_ROWS = ours
    return 0


if __name__ == "__main__":
    sys.exit(main())
