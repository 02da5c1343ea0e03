"""Row-major copies of a shard's stacked columns, so a shuffled batch reads contiguous rows.

Shards are columnar: gathering one random row of ``K`` stacked columns costs ``K`` cache (and
mostly TLB) misses, one per column. With a true shuffle over the whole dataset that latency,
not conversion, bounds the fast path (bench/RESULTS.md, "Loader"). Copying the stacked
outputs of an open shard once into row-major matrices (``features`` -> float32 ``[rows, K]``,
``categoricals`` -> int64 ``[rows, C]``, a list column whose values all have the same length
``L`` and no nulls -> ``[rows, L]``) turns each row into a few consecutive cache lines.

The copy is made with the gather kernels themselves (:mod:`stoker.loader.kernels`) over
consecutive rows, block by block, so it holds *exactly* the values the column path writes
(casts, nulls -> 0): batches are bitwise equal whichever path serves a row.

Memory is explicit: :class:`RowMajorBudget` decides how many bytes of copies may exist at
once across the open shards (see :data:`AUTO_BUDGET_BYTES`).
"""

from __future__ import annotations

import mmap
import os
import threading
from typing import TYPE_CHECKING, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stoker.loader import kernels as k
from stoker.loader.jit import kernel

if TYPE_CHECKING:
    from stoker.loader.fastpath import FastPlan, ShardData

__all__ = ["AUTO_BUDGET_BYTES", "RowMajorBudget", "build", "gather_rows", "plan_bytes",
           "resolve_mode"]

#: ``row_major="auto"`` keeps at most this many bytes of row-major copies alive: 2 GiB, or a
#: quarter of physical memory when that is smaller.
AUTO_BUDGET_BYTES = 2 << 30

_BLOCK = 2048  # rows per list-copy block (bounds the kernels' scratch arrays)
_TILE = 256  # rows per tile of copy_fixed: 256 rows x 64 float32 = 64 KiB stays in L1/L2


def _physical_memory() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def resolve_mode(row_major: bool | str) -> int:
    """The byte budget for ``row_major`` (``0``: off; ``-1``: unbounded).

    Raises:
        ValueError: ``row_major`` is not ``True``, ``False`` or ``"auto"``.
    """
    if row_major is True:
        return -1
    if row_major is False:
        return 0
    if row_major == "auto":
        phys = _physical_memory()
        return min(AUTO_BUDGET_BYTES, phys // 4) if phys else AUTO_BUDGET_BYTES
    raise ValueError(f"row_major={row_major!r} is not supported; use True (always copy open "
                     "shards row-major), False (never) or 'auto' (copy while the copies fit "
                     f"min(2 GiB, physical memory / 4)).")


class RowMajorBudget:
    """Bytes of row-major copies alive across open shards, against a limit (thread-safe)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def reserve(self, nbytes: int) -> bool:
        """Take ``nbytes`` from the budget if they fit; whether they did."""
        with self._lock:
            if self.limit >= 0 and self.used + nbytes > self.limit:
                return False
            self.used += nbytes
            return True

    def release(self, nbytes: int) -> None:
        with self._lock:
            self.used -= nbytes


def _list_width(batches: Sequence[pa.RecordBatch], name: str) -> int:
    """The common length of every value of list column ``name``, or 0 if lengths differ or
    any list is null (such columns keep the column path)."""
    width = -1
    for b in batches:
        arr = b.column(name)
        if arr.null_count or len(arr) == 0:
            if arr.null_count:
                return 0
            continue
        lengths = pc.list_value_length(arr)
        lo, hi = pc.min_max(lengths).values()
        if lo.as_py() != hi.as_py() or (width >= 0 and lo.as_py() != width):
            return 0
        width = int(lo.as_py())
    return max(width, 0)


def _targets(plan: FastPlan, batches: Sequence[pa.RecordBatch]) -> list[tuple[str, str, int, np.dtype]]:
    """(output, kind, width, dtype) of each output that gets a row-major copy."""
    out = []
    for o in plan.outputs:
        if o.kind == "matrix":
            out.append((o.name, "matrix", len(o.columns), np.dtype(o.dtype)))
        elif o.kind == "list":
            width = _list_width(batches, o.name)
            if width:
                out.append((o.name, "list", width, np.dtype(o.dtype)))
    return out


def plan_bytes(plan: FastPlan, batches: Sequence[pa.RecordBatch]) -> int:
    """Bytes the row-major copies of one shard would take."""
    rows = sum(b.num_rows for b in batches)
    return sum(rows * w * dt.itemsize for _, _, w, dt in _targets(plan, batches))


@kernel
def _copy_list(views, meta, starts, out):  # type: ignore[no-untyped-def]
    """Every row of the shard, in order, through :func:`kernels.gather_list`, block by block."""
    rows = np.empty(_BLOCK, dtype=np.int64)
    for c in range(starts.shape[0] - 1):
        for lo in range(starts[c], starts[c + 1], _BLOCK):
            n = min(_BLOCK, starts[c + 1] - lo)
            chunk = np.full(n, c, dtype=np.int64)
            row = rows[:n]
            for i in range(n):
                row[i] = lo - starts[c] + i
            dest = row + starts[c]
            k.gather_list(views, meta, chunk, row, dest, out)


def _allocate(rows: int, width: int, dtype: np.dtype) -> np.ndarray:
    """An uninitialised ``[rows, width]`` array in plain anonymous pages.

    Not ``np.empty``: NumPy advises huge pages for large arrays, and with the kernel's
    ``defrag=madvise`` setting every fault then compacts memory; measured here a shard's copy
    took 3x longer that way, and the gathers were no faster with huge pages. Pages are
    populated up front: the copy writes all of them anyway.
    """
    nbytes = rows * width * dtype.itemsize
    if nbytes == 0:
        return np.empty((rows, width), dtype=dtype)
    # MAP_POPULATE (Linux) faults every page in at once: half the cost of one fault per page
    flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0) | getattr(mmap, "MAP_POPULATE", 0)
    try:
        region = mmap.mmap(-1, nbytes, flags=flags)
    except (OSError, ValueError, TypeError):  # a platform without these flags
        region = mmap.mmap(-1, nbytes)
    return np.frombuffer(region, dtype=dtype).reshape(rows, width)


def build(plan: FastPlan, data: ShardData, batches: Sequence[pa.RecordBatch]) -> dict[str, np.ndarray]:
    """Row-major copies of ``data``'s stacked outputs (output name -> ``[rows, width]``)."""
    rows = int(data.starts[-1])
    copies: dict[str, np.ndarray] = {}
    for name, kind, width, dtype in _targets(plan, batches):
        mat = _allocate(rows, width, dtype)
        if kind == "matrix":
            cols = next(o.columns for o in plan.outputs if o.name == name)
            k.copy_fixed(data.views, data.matrix_meta(cols), data.starts, _TILE, mat)
        else:
            _copy_list(data.views, data.meta[name], data.starts, mat)
        copies[name] = mat
    return copies


@kernel
def gather_rows(mat, starts, chunk, row, dest, out):  # type: ignore[no-untyped-def]
    """``out[dest[i], :] = mat[starts[chunk[i]] + row[i], :]``: one contiguous row per sample.

    Two passes: the first computes every source row (no misses), the second copies, so the
    loop carrying the misses is short and many of them are in flight at once.
    """
    n = chunk.shape[0]
    width = mat.shape[1]
    src = np.empty(n, dtype=np.int64)
    for i in range(n):
        src[i] = starts[chunk[i]] + row[i]
    for i in range(n):
        s = src[i]
        d = dest[i]
        for j in range(width):
            out[d, j] = mat[s, j]
