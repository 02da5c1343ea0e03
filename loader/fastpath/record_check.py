"""Stored row-major records checked against their shard's columns before they are served.

A record file's trailing xxh3-128 (:mod:`stoker.loader.fastpath.record_store`) proves only that
the file is the one that was written, not that what was written is right: a stale or buggy
build, or anyone who rewrites the bytes and the checksum with them, leaves a file that passes
it. So a process that maps a record file it did not write compares it with the shard itself,
the source of truth, before serving it: the first and last rows and :data:`SAMPLE_ROWS`
distinct rows drawn at random in this process (every row of a shard that has no more) are
recomputed from the shard's Arrow columns and compared byte for byte with the mapped records,
field by field (the bytes a batch would take from them; padding and the fields left out for
the shard are not served and not compared).

The rows are drawn from :mod:`secrets` (the operating system's entropy), afresh at every
mapping, so no build, stale or not, can know which rows will be looked at. What a sampled
check proves, honestly: if a fraction ``f`` of a shard's rows is wrong, ``k`` rows drawn at
random catch it with probability ``1 - (1 - f)^k`` (``k`` = 64: 47 % for ``f`` = 1 %,
99.9 % for ``f`` = 10 %; sampling without replacement does slightly better), and every
process that maps the file draws again. A wrong first or last row (a file torn, shifted or
written over from its start or its end) is always caught. It does *not* prove every row: a
single wrong row among millions will most likely be served. What proves every delivered
byte is the audit afterwards: ``stoker audit RUN --dataset DATASET`` rebuilds every step's
batch from the verified shards and compares it with the content digests the ledger recorded
(:mod:`stoker.tools.audit`).

The expected rows are gathered with the column path's NumPy twins
(:mod:`stoker.loader.fastpath.kernels_np`: the same arena views and column metadata as the
kernels, the same bytes, tested byte for byte in tests/fastpath/test_cold_start.py). Not the
Numba kernels: a shard may open before they are compiled (a fresh node), and the check must
not wait 25-60 s for a compile; and code that did not build the records is a better witness
against a build bug than the kernels that built them.
"""

from __future__ import annotations

import random
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from stoker.loader.fastpath import kernels_np

if TYPE_CHECKING:
    from stoker.loader.fastpath.plan import ShardData
    from stoker.loader.fastpath.rowmajor import RecordLayout

__all__ = ["SAMPLE_ROWS", "Mismatch", "first_mismatch", "sample_block", "sample_rows"]

#: Rows drawn at random per mapping, besides the first and the last (every row of a shard with
#: at most ``SAMPLE_ROWS + 2``). On a W1 shard (600,000 rows, 235 MB of records) the check of
#: 64 rows costs ~14 ms, about what mapping and verifying the file costs, and 1,024 rows ~1.7x
#: that; building the records costs ~250 ms (bench/records_check_bench.py, bench/RESULTS.md).
SAMPLE_ROWS = 64


@dataclass(frozen=True, slots=True)
class Mismatch:
    """A checked ``row`` of the shard whose stored record differs in output ``field``."""

    row: int
    field: str


def sample_rows(rows: int, k: int | None = None) -> np.ndarray:
    """Sorted int64 row numbers to check in a shard of ``rows`` rows: ``0``, ``rows - 1`` and
    ``k`` (default :data:`SAMPLE_ROWS`) distinct rows between them drawn from the operating
    system's entropy; every row when there are no more than ``k + 2``."""
    k = SAMPLE_ROWS if k is None else k
    if rows <= k + 2:
        return np.arange(rows, dtype=np.int64)
    # Python's sampler over a range: NumPy's would import numpy.random (and np.unique
    # numpy.ma), ~16 ms of the first shard a process opens
    inner = random.Random(secrets.randbits(128)).sample(range(1, rows - 1), k)
    return np.array(sorted([0, rows - 1, *inner]), dtype=np.int64)


def sample_block(rows: int, k: int | None = None) -> np.ndarray:
    """Like :func:`sample_rows`, but the ``k`` rows between the ends are consecutive, from an
    offset drawn from the operating system's entropy: for a shard and its records past memory,
    where each checked row costs a read per column and per record, one run does instead
    (stoker.loader.read.staged_files)."""
    k = SAMPLE_ROWS if k is None else k
    if rows <= k + 2:
        return np.arange(rows, dtype=np.int64)
    start = 1 + secrets.randbelow(rows - 1 - k)
    return np.unique(np.concatenate([[0, rows - 1], np.arange(start, start + k)])
                     ).astype(np.int64)


def first_mismatch(layout: RecordLayout, data: ShardData, records: np.ndarray,
                   skip: Sequence[str] = (), rows: np.ndarray | None = None) -> Mismatch | None:
    """A row of ``rows`` (default :func:`sample_rows`) whose record in ``records`` (uint8
    ``[shard rows, layout.stride]``, or anything whose ``[rows]`` gives those rows) differs from what the shard's columns give (the first
    found, output by output), or ``None`` when every checked row matches. Fields in ``skip``
    (the shard's misfits) are not held by the records and not compared."""
    shard_rows = int(data.starts[-1])
    rows = sample_rows(shard_rows) if rows is None else np.asarray(rows, dtype=np.int64)
    if not len(rows):
        return None
    chunk = np.searchsorted(data.starts, rows, side="right") - 1
    local = rows - data.starts[chunk]
    touched, nth = np.unique(chunk, return_inverse=True)  # metadata of these batches only
    nth = nth.astype(np.int64)
    dest = np.arange(len(rows), dtype=np.int64)
    stored = records[rows]  # [n, stride]: a copy of the checked rows only
    for f in layout.fields:
        if f.name in skip:
            continue
        expected = np.zeros((len(rows), f.width), dtype=f.dtype)
        if f.kind == "list":  # a value of another length (or null) is no record's field
            lengths = np.empty(len(rows), dtype=np.int64)
            kernels_np.var_lengths(data.views, data.meta[f.name], chunk, local, dest, lengths)
            ragged = np.flatnonzero(lengths != f.width)
            if len(ragged):
                return Mismatch(int(rows[ragged[0]]), f.name)
            kernels_np.gather_list(data.views, data.meta[f.name], chunk, local, dest, expected)
        else:
            kernels_np.gather_fixed(data.views, data.matrix_meta_of(f.columns, touched), nth,
                                    local, dest, expected)
        got = stored[:, f.offset:f.offset + f.nbytes]
        bad = np.flatnonzero((got != expected.view(np.uint8).reshape(len(rows), -1)).any(1))
        if len(bad):
            return Mismatch(int(rows[bad[0]]), f.name)
    return None
