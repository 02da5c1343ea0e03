"""Row-major records of open shards, so a shuffled batch is one fused gather.

Shards are columnar: gathering one random row of ``K`` stacked columns costs ``K`` cache (and
mostly TLB) misses, one per column. With a true shuffle over the whole dataset that latency,
not conversion, bounds the column path (bench/RESULTS.md, "Loader"). So each open shard's
fixed-width outputs are copied once into one **record per row**: ``features`` (float32
``[K]``), ``categoricals`` (int64 ``[C]``), every fixed-width column output (e.g. an int64
label) and every list column whose values all have one length ``L`` and no nulls (``[L]``),
side by side (:class:`RecordLayout`). A shuffled row is then a few consecutive cache lines,
and one kernel call (:class:`stoker.loader.fastpath.record_table.RecordTable`) fills every such output
of a whole batch from any number of shards, prefetching rows ahead so many misses are in
flight at once.

The copy is made with the column kernels themselves (:mod:`stoker.loader.fastpath.kernels`) over
consecutive rows, so it holds *exactly* the values the column path writes (casts, nulls -> 0):
batches are bitwise equal whichever path serves a row.

Memory is explicit: :class:`RowMajorBudget` decides how many bytes of records may exist at
once across the open shards (see :data:`AUTO_BUDGET_BYTES`).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import pyarrow as pa

from stoker.loader.fastpath import kernels as k
from stoker.loader.fastpath.ipc_meta import FileBatches
from stoker.loader.fastpath.ring import fresh_pages
from stoker.loader.jit import aot

if TYPE_CHECKING:
    from stoker.loader.fastpath.plan import FastPlan, ShardData

__all__ = ["AUTO_BUDGET_BYTES", "Field", "RecordLayout", "RowMajorBudget", "build",
           "built_ahead", "resolve_mode"]

#: ``row_major="auto"`` keeps at most this many bytes of row-major copies alive: 2 GiB, or a
#: quarter of physical memory when that is smaller.
AUTO_BUDGET_BYTES = 2 << 30

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
    any list is null (such columns keep the column path).

    Every batch's offsets side by side, one NumPy pass over them: a shard of 1,024-row
    batches has hundreds, and NumPy calls per batch cost ~0.1 ms each (0.23 s of a first
    batch that opened four 600-batch shards). Not ``pyarrow.compute``: importing it takes
    ~0.1 s of a process's start (it writes the docstrings of every compute function)."""
    if not batches:
        return 0
    if isinstance(batches, FileBatches) and (width := batches.list_width(name)) is not None:
        return width  # from the file's offsets, no record batch read
    column = pa.chunked_array([b.column(name) for b in batches])
    if column.null_count or not len(column):
        return 0
    if pa.types.is_fixed_size_list(column.type):
        return int(column.type.list_size)
    chunks = [c for c in column.chunks if len(c)]
    offsets = np.concatenate([c.offsets.to_numpy() for c in chunks])
    lengths = np.diff(offsets)
    # the differences across two chunks' offsets are no list's length
    lengths[np.cumsum([len(c) + 1 for c in chunks[:-1]], dtype=np.int64) - 1] = lengths[0]
    lo, hi = int(lengths.min()), int(lengths.max())
    return 0 if lo != hi else lo


def _allocate(rows: int, width: int, dtype: np.dtype) -> np.ndarray:
    """An uninitialised ``[rows, width]`` array in plain anonymous pages
    (:func:`~stoker.loader.fastpath.ring.fresh_pages`)."""
    nbytes = rows * width * dtype.itemsize
    if nbytes == 0:
        return np.empty((rows, width), dtype=dtype)
    return fresh_pages(nbytes).view(dtype).reshape(rows, width)


@dataclass(frozen=True, slots=True)
class Field:
    """One output inside a record: ``width`` values of ``dtype`` at byte ``offset``."""

    name: str
    kind: str  # "matrix" | "fixed" | "list" (the plan's output kind)
    offset: int
    width: int
    dtype: np.dtype
    columns: tuple[str, ...]  # the source columns, in output order

    @property
    def nbytes(self) -> int:
        return self.width * self.dtype.itemsize


class RecordLayout:
    """Where each record-held output lives in a row's record (the same for every shard)."""

    def __init__(self, fields: Sequence[Field]) -> None:
        self.fields = tuple(fields)
        end = max((f.offset + f.nbytes for f in self.fields), default=0)
        self.stride = (end + 7) // 8 * 8

    @classmethod
    def of(cls, plan: FastPlan, batches: Sequence[pa.RecordBatch]) -> RecordLayout | None:
        """The layout for ``plan``; list outputs are included when their values all have one
        length in ``batches`` (a shard). ``None`` when no output fits a record."""
        fields: list[Field] = []
        offset = 0
        for o in plan.outputs:
            width = len(o.columns) if o.kind in ("matrix", "fixed") else \
                _list_width(batches, o.name) if o.kind == "list" else 0
            if width and o.dtype is not None:
                fields.append(Field(o.name, o.kind, offset, width, np.dtype(o.dtype), o.columns))
                offset += (width * np.dtype(o.dtype).itemsize + 7) // 8 * 8
        return cls(fields) if fields else None

    def key(self, skip: Sequence[str] = ()) -> str:
        """Everything records' bytes depend on besides the shard (names their files)."""
        parts = [f"{f.name}:{f.kind}:{f.offset}:{f.width}:{f.dtype.str}:{','.join(f.columns)}"
                 for f in self.fields]
        return ";".join(parts) + f"|stride={self.stride}|skip={','.join(sorted(skip))}"

    def misfits(self, batches: Sequence[pa.RecordBatch]) -> list[str]:
        """List outputs whose values in ``batches`` (a shard) do not all have this layout's
        length (or are null): the records cannot serve those outputs for this shard."""
        return [f.name for f in self.fields
                if f.kind == "list" and _list_width(batches, f.name) != f.width]


def build(layout: RecordLayout, data: ShardData, skip: Sequence[str] = (),
          out: np.ndarray | None = None) -> np.ndarray:
    """The records of ``data``'s shard: uint8 ``[rows, layout.stride]``, written into ``out``
    (``rows * stride`` bytes) or new anonymous memory; fields in ``skip`` (the shard's
    :meth:`RecordLayout.misfits`) are left unwritten."""
    rows = int(data.starts[-1])
    rec = _allocate(rows, layout.stride, np.dtype(np.uint8)) if out is None \
        else out.reshape(rows, layout.stride)
    for f in layout.fields:
        view = rec[:, f.offset:f.offset + f.nbytes].view(f.dtype)
        if f.name in skip:
            continue
        if f.kind == "list":
            whole = np.zeros(1, dtype=np.int64)  # one run: every row of the shard, in order
            meta = data.meta[f.name]
            _builder(k.copy_list_ranges, "copy_list_ranges", f.dtype, meta, data.starts)(
                data.views, meta, data.starts, whole, data.starts[-1:], whole, view)
        else:
            meta = data.matrix_meta(f.columns)
            _builder(k.copy_fixed, "copy_fixed", f.dtype, meta, data.starts)(
                data.views, meta, data.starts, _TILE, view)
    return rec


def built_ahead(plan: FastPlan) -> bool:
    """Whether every record field ``plan`` can have is built by a kernel compiled ahead of
    time on this node (:func:`_builder`), and copied into staged rounds by one
    (stoker.loader.read.staging): building its records then needs no Numba."""
    dtypes = {np.dtype(o.dtype).name for o in plan.outputs
              if o.kind in ("matrix", "fixed", "list") and o.dtype is not None}
    return all(aot.function(f"{kind}_{d}") is not None for d in dtypes
               for kind in ("copy_fixed", "copy_list_ranges", "copy_ranges"))


def _builder(fn: Callable[..., None], name: str, dtype: np.dtype, *index: np.ndarray
             ) -> Callable[..., None]:
    """Builder ``fn``, or, until this process loaded it, its twin compiled ahead of time for
    fields of ``dtype`` when the node has one (stoker.loader.jit.aot): a node's first run
    then builds records from the moment a shard opens, not after Numba's start-up (~0.9 s
    into a run). The same bytes either way (tests/fastpath/test_aot.py); ``index``: the
    metadata and starts arrays (:func:`stoker.loader.jit.aot.twin`)."""
    return aot.serving(fn, f"{name}_{dtype.name}", *index)
