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
from stoker.loader.fastpath.ring import fresh_pages, populate
from stoker.loader.jit import aot

if TYPE_CHECKING:
    from stoker.loader.fastpath.plan import FastPlan, ShardData
    from stoker.loader.fastpath.record_store import TileClaims

__all__ = ["AUTO_BUDGET_BYTES", "Field", "RecordLayout", "RowMajorBudget", "Tiles", "build",
           "built_ahead", "copy_runs", "resolve_mode"]

#: ``row_major="auto"`` keeps at most this many bytes of row-major copies alive: 2 GiB, or a
#: quarter of physical memory when that is smaller.
AUTO_BUDGET_BYTES = 2 << 30

_TILE = 256  # rows per block of copy_ranges: 256 rows x 64 float32 = 64 KiB stays in L1/L2


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


def _allocate(rows: int, width: int, dtype: np.dtype, faulted: bool = True) -> np.ndarray:
    """An uninitialised ``[rows, width]`` array in plain anonymous pages
    (:func:`~stoker.loader.fastpath.ring.fresh_pages`)."""
    nbytes = rows * width * dtype.itemsize
    if nbytes == 0:
        return np.empty((rows, width), dtype=dtype)
    return fresh_pages(nbytes, faulted).view(dtype).reshape(rows, width)


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
    return Tiles(layout, data, skip, out).build()


def copy_runs(rec: np.ndarray, fields: Sequence[Field], data: ShardData, first: np.ndarray,
              end: np.ndarray, dest: np.ndarray) -> None:
    """Runs of consecutive shard rows ``first[i]:end[i]`` -> records ``rec[dest[i]:]``, the
    ``fields`` of each (by the JIT kernels, or their twins compiled ahead of time)."""
    for f in fields:
        view = rec[:, f.offset:f.offset + f.nbytes].view(f.dtype)
        if f.kind == "list":
            meta = data.meta[f.name]
            _builder(k.copy_list_ranges, "copy_list_ranges", f.dtype, meta, data.starts, first,
                     end, dest)(data.views, meta, data.starts, first, end, dest, view)
        else:
            meta = data.matrix_meta(f.columns)
            _builder(k.copy_ranges, "copy_ranges", f.dtype, meta, data.starts, first, end,
                     dest)(data.views, meta, data.starts, first, end, dest, _TILE, view)


class Tiles:
    """One shard's records, built ``TILE_ROWS`` rows at a time by whichever threads need
    them, each tile once.

    The shard's builder thread (:meth:`build`) takes tiles from the last one back; a batch
    in natural order (:meth:`read`, stoker.loader.read.arrow) builds the tiles its rows fall
    in, from the first one on, and copies its rows out of them while they are in cache. On a
    node's first run a natural-order batch otherwise gathers its rows from the columns while
    the builder copies the same rows into records: the same columns read twice, on a
    machine whose two cores are then both busy. Each tile's pages are faulted in by the
    thread that builds it, in one call (:func:`~stoker.loader.fastpath.ring.populate`): on a
    VM that hands idle memory back to its host, faulting is most of a build's cost
    (bench/RESULTS.md "Fresh memory"). A file's map built in place too (for process
    workers): written page by page, its write faults were 57 % of a node's first natural
    run's page faults with 2 process workers (2 M W1 rows, ``perf record -e page-faults``).

    Args:
        layout: the records' layout.
        data: the open shard.
        skip: fields left unwritten (the shard's :meth:`RecordLayout.misfits`).
        out: ``rows * stride`` bytes to build into (a file's map: stoker.loader.fastpath.
            record_store), else new anonymous memory.
        claims: where other processes build tiles of ``out`` too, which process builds
            which (:class:`stoker.loader.fastpath.record_store.TileClaims`); a tile this
            process takes is then built here only if no other process built it.
    """

    TILE_ROWS = 16384  # ~6 MB of W1 records: a build worth a call, a wait short next to a batch

    @classmethod
    def count(cls, rows: int) -> int:
        """Tiles of a shard of ``rows`` rows."""
        return -(-rows // cls.TILE_ROWS)

    def __init__(self, layout: RecordLayout, data: ShardData, skip: Sequence[str] = (),
                 out: np.ndarray | None = None, claims: TileClaims | None = None) -> None:
        self.rows = int(data.starts[-1])
        self.skip = tuple(skip)
        self.records = _allocate(self.rows, layout.stride, np.dtype(np.uint8),
                                 faulted=False) if out is None \
            else out.reshape(self.rows, layout.stride)
        self._fields = [f for f in layout.fields if f.name not in self.skip]
        self._data = data
        self._claims = claims
        self._state = bytearray(self.count(self.rows))  # _FREE, _BUSY, _DONE
        self._left = len(self._state)
        self._cond = threading.Condition()

    def build(self) -> np.ndarray:
        """Build every tile not taken yet, from the last one back, then wait for the tiles
        other threads are building; the records."""
        while (t := self._take_last()) is not None:
            self._make(t)
        with self._cond:
            while self._left:
                self._cond.wait()
        return self.records

    def help(self) -> bool:
        """Build one tile nobody took yet (from the last one back) for the thread that builds
        this shard (:meth:`build`); whether there was one."""
        t = self._take_last()
        if t is None:
            return False
        self._make(t)
        return True

    def untaken(self) -> int:
        """Tiles no thread took yet."""
        with self._cond:
            return self._state.count(_FREE)

    def read(self, lo: int, hi: int) -> np.ndarray:
        """Records of shard rows ``lo:hi``: their tiles built now by this thread when no
        other thread has taken them, else waited for; while it waits, this thread builds
        the next untaken tiles after them (at most ``_READ_AHEAD``), which the next
        batches will read. Thread workers in natural order read neighbouring batches, often
        of one tile: the second waited idle while the first built it."""
        for t in range(lo // self.TILE_ROWS, (hi - 1) // self.TILE_ROWS + 1):
            while (mine := self._take_for(t)) is not None:
                self._make(mine)
                if mine == t:
                    break
        return self.records[lo:hi]

    def _take_for(self, t: int) -> int | None:
        """For a read of tile ``t``: ``t`` itself, taken, when no thread took it; ``None``
        once it is built; while another thread builds it, the first untaken tile of the
        ``_READ_AHEAD`` after it, taken, else waits."""
        with self._cond:
            while True:
                if self._state[t] == _FREE:
                    self._state[t] = _BUSY
                    return t
                if self._state[t] == _DONE:
                    return None
                ahead = self._state.find(_FREE, t + 1, t + 1 + _READ_AHEAD)
                if ahead >= 0:
                    self._state[ahead] = _BUSY
                    return ahead
                self._cond.wait()

    def built_everywhere(self) -> bool:
        """Whether every tile is built, here or (with claims) by any process."""
        if self._claims is not None:
            return self._claims.all_done()
        with self._cond:
            return not self._left

    def _take_last(self) -> int | None:
        with self._cond:
            free = self._state.rfind(_FREE)
            if free < 0:
                return None
            self._state[free] = _BUSY
            return free

    def _make(self, t: int) -> None:
        """Build tile ``t`` (taken by this thread); given back untouched if that fails."""
        lo = t * self.TILE_ROWS
        hi = min(self.rows, lo + self.TILE_ROWS)
        made = False
        try:
            if self._claims is not None and not self._claims.claim(t):
                made = True  # another process built it
            else:
                try:
                    populate(self.records[lo:hi])
                    copy_runs(self.records, self._fields, self._data, np.array([lo]),
                              np.array([hi]), np.array([lo]))
                    made = True
                finally:
                    if self._claims is not None:
                        self._claims.release(t, made)
        finally:
            with self._cond:
                self._state[t] = _DONE if made else _FREE
                self._left -= made
                self._cond.notify_all()


_FREE, _BUSY, _DONE = 0, 1, 2
_READ_AHEAD = 2  # tiles a read waiting for its own tile may build meanwhile (Tiles.read)


def built_ahead(plan: FastPlan) -> bool:
    """Whether every record field ``plan`` can have is built by a kernel compiled ahead of
    time on this node (:func:`_builder`), and copied into staged rounds by one
    (stoker.loader.read.staging): building its records then needs no Numba."""
    dtypes = {np.dtype(o.dtype).name for o in plan.outputs
              if o.kind in ("matrix", "fixed", "list") and o.dtype is not None}
    return all(aot.function(f"{kind}_{d}") is not None for d in dtypes
               for kind in ("copy_list_ranges", "copy_ranges"))


def _builder(fn: Callable[..., None], name: str, dtype: np.dtype, *index: np.ndarray
             ) -> Callable[..., None]:
    """Builder ``fn``, or, until this process loaded it, its twin compiled ahead of time for
    fields of ``dtype`` when the node has one (stoker.loader.jit.aot): a node's first run
    then builds records from the moment a shard opens, not after Numba's start-up (~0.9 s
    into a run). The same bytes either way (tests/fastpath/test_aot.py); ``index``: the
    metadata and starts arrays (:func:`stoker.loader.jit.aot.twin`)."""
    return aot.serving(fn, f"{name}_{dtype.name}", *index)
