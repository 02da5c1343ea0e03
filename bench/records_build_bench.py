"""Building row-major records from a shard's columns: stoker's kernels against NumPy.

A node's first run of a shuffled W1 epoch builds every shard's records (64 float32 features,
8 int64 categoricals, list<float32>[16], int64 label: 392 bytes a row) before its batches can
be gathered from them, on the same two cores that serve the batches; natural-order batches
build the tiles they read (stoker.loader.fastpath.rowmajor). This times that copy alone, into
memory faulted in beforehand (what a fresh page costs is the machine's, bench/RESULTS.md
"Fresh memory"), each field and all of them, on the first ``--rows`` rows' shard of W1 at two
sizes, side by side in one process:

- ``stoker``: :class:`stoker.loader.fastpath.rowmajor.Tiles` (the kernels compiled ahead of
  time where the node has them, else the JIT ones; compiled before the measurement);
- ``numpy``: the same bytes with NumPy, a column at a time into the records' strided view
  (``view[:, j] = column``) per record batch, the best NumPy does without a temporary copy.

Every case checks its records equal the other's, byte for byte, before it is timed.

    .venv/bin/python bench/records_build_bench.py [--rows 100000 600000] [--repeats 7]
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

from stoker.loader.fastpath import rowmajor
from stoker.loader.fastpath.plan import FastPlan

sys.path.insert(0, str(Path(__file__).resolve().parent))

import loader_bench as lb  # noqa: E402 - W1's data
from records_check_bench import open_shard  # noqa: E402 - the shard as the loader opens it


def _numpy_build(fields: tuple[rowmajor.Field, ...], batches: list[pa.RecordBatch],
                 out: np.ndarray) -> None:
    """``out`` (uint8 ``[rows, stride]``) as the kernels write it, for columns without nulls
    and lists of one length (W1's)."""
    r0 = 0
    for batch in batches:
        r1 = r0 + batch.num_rows
        for f in fields:
            view = out[r0:r1, f.offset:f.offset + f.nbytes].view(f.dtype)
            if f.kind == "list":
                values = batch.column(f.name).flatten().to_numpy()
                view[:] = values.reshape(batch.num_rows, f.width)
                continue
            for j, name in enumerate(f.columns):
                view[:, j] = batch.column(name).to_numpy()
        r0 = r1


def _median_ms(fn: Callable[[], Any], repeats: int) -> float:
    return lb.median_seconds(fn, repeats) * 1e3


def run(rows: int, repeats: int, workdir: Path) -> list[str]:
    """Table rows for the W1 shard of ``rows`` rows: ms per build and rows/s, per field."""
    from stoker.manifest import Manifest

    root = lb.build_w1(workdir, rows) / "stoker"
    m = Manifest.load(str(root))
    path = root / m.shards[0].path
    plan = FastPlan(m.arrow_schema, [*lb.FEATURES, *lb.CATS, "seq", "label"], lb.FEATURES,
                    lb.CATS)
    data, batches = open_shard(path, plan)
    layout = rowmajor.RecordLayout.of(plan, batches)
    assert layout is not None and not layout.misfits(batches)
    shard_rows = int(data.starts[-1])
    mine = np.ones((shard_rows, layout.stride), np.uint8)  # faulted in before any timing
    theirs = np.zeros_like(mine)
    lines = []
    names = [f.name for f in layout.fields]
    for label, fields in [("all", layout.fields), *((f.name, (f,)) for f in layout.fields)]:
        skip = [n for n in names if n not in {f.name for f in fields}]

        def stoker() -> None:
            rowmajor.Tiles(layout, data, skip, mine).build()

        def numpy() -> None:
            _numpy_build(fields, batches, theirs)

        stoker()  # the kernels compiled or loaded
        numpy()
        if not np.array_equal(mine, theirs):
            raise AssertionError(f"{label}: stoker's records differ from NumPy's")
        t_stoker = _median_ms(stoker, repeats)
        t_numpy = _median_ms(numpy, repeats)
        lines.append(f"| {shard_rows:,} | {label} | {t_stoker:.1f} | {t_numpy:.1f} | "
                     f"{shard_rows / t_stoker / 1e3:.2f} | {shard_rows / t_numpy / 1e3:.2f} | "
                     f"{t_numpy / t_stoker:.2f}x |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 600_000],
                        help="W1 sizes (rows of its first shard, at most the sharder's 256 MB)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--workdir", type=Path,
                        default=Path(tempfile.gettempdir()) / "stoker-bench")
    args = parser.parse_args(argv)
    rows = [line for r in args.rows for line in run(r, args.repeats, args.workdir)]
    print(f"`.venv/bin/python bench/records_build_bench.py --rows {' '.join(map(str, args.rows))}"
          f" --repeats {args.repeats}` on {platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}: W1 records (stride 392 B) of one shard built into "
          f"memory faulted in before; medians of {args.repeats}.\n")
    print("| shard rows | field | stoker ms | NumPy ms | stoker M rows/s | NumPy M rows/s | "
          "stoker / NumPy |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
