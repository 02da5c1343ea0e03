"""A deterministic synthetic tabular dataset, shared by the demo, tests and benchmarks.

Schema (the shape of a production tabular training table): 64 float32 features
``f0..f63``, 8 int64 categoricals ``c0..c7``, one ``list<float32>`` ``seq`` of length 16,
and an int64 ``label``. Values are a pure function of ``(rows, seed)``.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["SEQ_LEN", "make_tabular_table", "tabular_schema", "write_tabular_parquet"]

SEQ_LEN = 16
_FLOATS, _INTS = 64, 8


def tabular_schema() -> pa.Schema:
    """The synthetic table's schema."""
    return pa.schema([pa.field(f"f{i}", pa.float32()) for i in range(_FLOATS)]
                     + [pa.field(f"c{i}", pa.int64()) for i in range(_INTS)]
                     + [pa.field("seq", pa.list_(pa.float32())), pa.field("label", pa.int64())])


def make_tabular_table(rows: int, seed: int = 0, start: int = 0) -> pa.Table:
    """Rows ``[start, start + rows)`` of the synthetic dataset for ``seed``.

    Each chunk of rows is generated from its own seeded stream (``seed``, chunk start), so
    any split of the rows into calls gives the same data.
    """
    if rows < 0 or start < 0:
        raise ValueError(f"rows={rows} and start={start} must be >= 0")
    parts = []
    chunk = 1 << 16
    first = start - start % chunk
    for lo in range(first, start + rows, chunk):
        rng = np.random.default_rng([seed, lo])
        block = _block(rng, chunk)
        a, b = max(start - lo, 0), min(start + rows - lo, chunk)
        parts.append(block.slice(a, b - a))
    if not parts:
        return tabular_schema().empty_table()
    return pa.concat_tables(parts).combine_chunks()


def _block(rng: np.random.Generator, n: int) -> pa.Table:
    floats = rng.standard_normal((_FLOATS, n), dtype=np.float32)
    ints = rng.integers(0, 1000, size=(_INTS, n), dtype=np.int64)
    seq = rng.standard_normal(n * SEQ_LEN, dtype=np.float32)
    offsets = np.arange(0, (n + 1) * SEQ_LEN, SEQ_LEN, dtype=np.int32)
    label = rng.integers(0, 2, size=n, dtype=np.int64)
    arrays = [pa.array(c) for c in floats] + [pa.array(c) for c in ints]
    arrays += [pa.ListArray.from_arrays(pa.array(offsets), pa.array(seq)), pa.array(label)]
    return pa.Table.from_arrays(arrays, schema=tabular_schema())


def write_tabular_parquet(path: str | os.PathLike[str], rows: int, seed: int = 0,
                          row_group_rows: int = 65536) -> None:
    """Write the synthetic dataset as one Parquet file (snappy), generated chunk by chunk."""
    with pq.ParquetWriter(os.fspath(path), tabular_schema()) as writer:
        for lo in range(0, rows, row_group_rows):
            n = min(row_group_rows, rows - lo)
            writer.write_table(make_tabular_table(n, seed, lo), row_group_size=row_group_rows)
