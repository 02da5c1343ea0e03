"""Row-major records of open shards, so a shuffled batch is one fused gather.

Shards are columnar: gathering one random row of ``K`` stacked columns costs ``K`` cache (and
mostly TLB) misses, one per column. With a true shuffle over the whole dataset that latency,
not conversion, bounds the column path (bench/RESULTS.md, "Loader"). So each open shard's
fixed-width outputs are copied once into one **record per row**: ``features`` (float32
``[K]``), ``categoricals`` (int64 ``[C]``), every fixed-width column output (e.g. an int64
label) and every list column whose values all have one length ``L`` and no nulls (``[L]``),
side by side (:class:`RecordLayout`). A shuffled row is then a few consecutive cache lines,
and one kernel call (:func:`gather`) fills every such output of a whole batch from any number
of shards, prefetching rows ahead so many misses are in flight at once.

The copy is made with the column kernels themselves (:mod:`stoker.loader.kernels`) over
consecutive rows, so it holds *exactly* the values the column path writes (casts, nulls -> 0):
batches are bitwise equal whichever path serves a row.

Memory is explicit: :class:`RowMajorBudget` decides how many bytes of records may exist at
once across the open shards (see :data:`AUTO_BUDGET_BYTES`).
"""

from __future__ import annotations

import mmap
import os
import threading
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np
import pyarrow as pa

from stoker.loader import kernels as k
from stoker.loader import warmup
from stoker.loader.intrinsics import pointer, prefetch
from stoker.loader.jit import kernel

if TYPE_CHECKING:
    from stoker.loader.fastpath import FastPlan, ShardData
    from stoker.loader.ring import Slot

__all__ = ["AUTO_BUDGET_BYTES", "Field", "RecordLayout", "RecordTable", "RowMajorBudget",
           "build", "resolve_mode"]

#: ``row_major="auto"`` keeps at most this many bytes of row-major copies alive: 2 GiB, or a
#: quarter of physical memory when that is smaller.
AUTO_BUDGET_BYTES = 2 << 30

_BLOCK = 2048  # rows per list-copy block (bounds the kernels' scratch arrays)
_TILE = 256  # rows per tile of copy_fixed: 256 rows x 64 float32 = 64 KiB stays in L1/L2
_AHEAD = 16  # rows prefetched ahead by the gather (0.09 ms per W1 batch; 4-32 all within 10 %)


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
        # list or large_list offsets: the lengths are their differences
        dtype = np.int64 if pa.types.is_large_list(arr.type) else np.int32
        offsets = np.frombuffer(arr.buffers()[1], dtype=dtype)[arr.offset:arr.offset + len(arr) + 1]
        lengths = np.diff(offsets)
        lo, hi = int(lengths.min()), int(lengths.max())
        if lo != hi or (width >= 0 and lo != width):
            return 0
        width = lo
    return max(width, 0)


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
            _copy_list(data.views, data.meta[f.name], data.starts, view)
        else:
            k.copy_fixed(data.views, data.matrix_meta(f.columns), data.starts, _TILE, view)
    return rec


@kernel
def _gather(ids, starts, addrs, stride, offsets, sizes,  # type: ignore[no-untyped-def]
            out_addrs, out_strides, missing, marks, stamp, touched):
    """Write bytes ``offsets[f]:offsets[f] + sizes[f]`` of sample ``ids[i]``'s record at
    address ``out_addrs[f] + i * out_strides[f]`` (row ``i`` of output ``f``); returns
    ``(m, t)``: ``missing[:m]`` are the batch rows whose shard has no record
    (``addrs[shard] == 0``), ``touched[:t]`` the shards read (``marks`` holds the last
    ``stamp`` that saw each shard). Outputs go by address, not as a tuple of arrays: Numba
    types a tuple argument in Python on every call (~20 us), and one signature then serves
    every layout."""
    n = ids.shape[0]
    last = starts.shape[0] - 1
    src = np.empty(n, dtype=np.int64)
    m = 0
    t = 0
    for i in range(n):
        g = ids[i]
        lo = 0
        hi = last
        while hi - lo > 1:
            mid = (lo + hi) >> 1
            if starts[mid] <= g:
                lo = mid
            else:
                hi = mid
        a = addrs[lo]
        if a == 0:
            src[i] = 0
            missing[m] = i
            m += 1
        else:
            src[i] = a + (g - starts[lo]) * stride
            if marks[lo] != stamp:
                marks[lo] = stamp
                touched[t] = lo
                t += 1
    for i in range(min(_AHEAD, n)):
        if src[i] != 0:
            for b in range(0, stride, 64):
                prefetch(src[i] + b)
    for i in range(n):
        j = i + _AHEAD
        if j < n and src[j] != 0:
            for b in range(0, stride, 64):
                prefetch(src[j] + b)
        if src[i] == 0:
            continue
        p = pointer(src[i])
        for f in range(offsets.shape[0]):
            q = pointer(out_addrs[f] + i * out_strides[f])
            off = offsets[f]
            for b in range(sizes[f]):
                q[b] = p[off + b]
    return m, t


class RecordTable:
    """The records of the open shards, addressable from one kernel call.

    ``addrs[shard]`` is the address of the shard's records (0: none). A record removed while
    a batch may be reading it is *retired*, not freed: it is dropped once every batch that
    started before the removal has finished (a generation count), so a kernel never reads
    freed memory, whatever the threads do.

    Args:
        layout: the record layout of every shard's records.
        shards: number of shards in the dataset.
    """

    def __init__(self, layout: RecordLayout, shards: int) -> None:
        self.layout = layout
        self.addrs = np.zeros(shards, dtype=np.int64)
        self._marks = np.zeros(shards, dtype=np.int64)
        self._records: dict[int, np.ndarray] = {}
        self._retired: list[tuple[int, np.ndarray]] = []
        self._generation = 0
        self._readers: Counter[int] = Counter()
        self._stamp = 0
        self._lock = threading.Lock()
        self._serving = self._describe(layout.fields)  # lists may drop out (see add)

    @staticmethod
    def _describe(fields: Sequence[Field]) -> tuple[tuple[Field, ...], np.ndarray, np.ndarray]:
        return (tuple(fields), np.array([f.offset for f in fields], dtype=np.int64),
                np.array([f.nbytes for f in fields], dtype=np.int64))

    @property
    def fields(self) -> tuple[Field, ...]:
        """The fields records serve now."""
        return self._serving[0]

    def add(self, shard: int, records: np.ndarray, misfits: Sequence[str] = ()) -> None:
        """Serve ``shard`` from ``records``; list outputs in ``misfits`` stop being served
        from records (for every shard: a batch's list must have one width)."""
        with self._lock:
            if misfits:
                self._serving = self._describe([f for f in self._serving[0]
                                                if f.name not in misfits])
            if shard in self._records:  # replaced (e.g. by the same records, mapped from disk)
                self._retire_locked(shard)
            self._records[shard] = records
            self.addrs[shard] = records.ctypes.data

    def remove(self, shard: int) -> None:
        with self._lock:
            if shard in self._records:
                self._retire_locked(shard)
                self.addrs[shard] = 0

    def _retire_locked(self, shard: int) -> None:
        self._generation += 1
        self._retired.append((self._generation, self._records.pop(shard)))
        self._collect_locked()

    def __contains__(self, shard: int) -> bool:
        return shard in self._records

    def __len__(self) -> int:
        return len(self._records)

    def _collect_locked(self) -> None:
        oldest = min(self._readers, default=self._generation + 1)
        self._retired = [(g, r) for g, r in self._retired if g > oldest]

    @contextmanager
    def _reading(self) -> Iterator[tuple[tuple[tuple[Field, ...], np.ndarray, np.ndarray], int]]:
        with self._lock:
            generation = self._generation
            self._readers[generation] += 1
            self._stamp += 1
            stamp = self._stamp
            serving = self._serving
        try:
            yield serving, stamp
        finally:
            with self._lock:
                self._readers[generation] -= 1
                if not self._readers[generation]:
                    del self._readers[generation]
                self._collect_locked()

    def gather(self, ids: np.ndarray, starts: np.ndarray, slot: Slot,
               kernel: bool = False) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """Fill the record-served outputs of the batch ``ids`` into ``slot`` (with NumPy while
        the kernel is still being loaded by a warm-up thread on a process's first batch, unless
        ``kernel``).

        Returns ``(outputs, missing, touched)``: output name -> array (rows in ``missing``,
        batch positions whose shard has no records, are left for the column path) and the
        shards read.
        """
        n = len(ids)
        with self._reading() as ((fields, offsets, sizes), stamp):
            if not fields:
                return {}, np.arange(n, dtype=np.int64), np.empty(0, dtype=np.int64)
            arrays = {f.name: slot.array(f.name, (n, f.width), f.dtype) for f in fields}
            outs = [arrays[f.name].view(np.uint8) for f in fields]
            if not kernel and warmup.first_call("gather") and not _gather.signatures:
                missing_, touched_ = self._gather_numpy(ids, starts, fields, outs)
                return arrays, missing_, touched_
            missing = np.empty(n, dtype=np.int64)
            touched = np.empty(n, dtype=np.int64)
            out_addrs = np.array([o.__array_interface__["data"][0] for o in outs], dtype=np.int64)
            out_strides = np.array([o.strides[0] for o in outs], dtype=np.int64)
            m, t = _gather(ids, starts, self.addrs, self.layout.stride, offsets, sizes,
                           out_addrs, out_strides, missing, self._marks, stamp, touched)
        return arrays, missing[:m], touched[:t]

    def _gather_numpy(self, ids: np.ndarray, starts: np.ndarray, fields: Sequence[Field],
                      outs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """:func:`_gather` with NumPy fancy indexing (~1 ms per W1 batch): what the first
        batches of a fresh process use while Numba starts up."""
        with self._lock:
            records = dict(self._records)
        shard = np.searchsorted(starts, ids, side="right") - 1
        held = np.isin(shard, np.fromiter(records, dtype=np.int64, count=len(records)))
        touched = np.unique(shard[held])
        for s in touched.tolist():
            rows = np.flatnonzero(shard == s)
            picked = records[s][ids[rows] - starts[s]]
            for f, out in zip(fields, outs):
                out[rows] = picked[:, f.offset:f.offset + f.nbytes]
        return np.flatnonzero(~held), touched
