"""Staging for Parquet indexed in place: rounds copied row-major out of decoded row groups.

An indexed Parquet file cannot be memory-mapped as Arrow: each row group must be decoded.
Staging (:mod:`stoker.loader.read.staging`) reads a round's runs of consecutive rows, and a
partition's next round continues where its last one stopped, so a decoded row group serves
about ``rows per group / K`` consecutive rounds. :class:`RowGroups` keeps the decoded groups
the order's working set needs (``stoker.loader.read.order_plan`` sizes it: at most
``P/W x span(3K)`` groups), so each group is decoded about once per epoch: as the stager's
records when its columns are plain (:func:`plain_records`: runs are then copied out whole),
else as kernel inputs (:class:`~stoker.loader.fastpath.plan.ShardData` over a packed copy). The
group after the one a round read is decoded ahead in a background thread. A group whose
records the node kept from an earlier run (:mod:`stoker.loader.read.indexed.group_records`)
is mapped instead of decoded, and a decoded group's records are saved for later runs.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa

from stoker.loader.fastpath import kernels as k
from stoker.loader.fastpath import warm
from stoker.loader.fastpath.plan import FastPlan, ShardData
from stoker.loader.fastpath.ring import BufferRing, Slot
from stoker.loader.fastpath.rowmajor import Field, RecordLayout
from stoker.loader.jit import aot
from stoker.loader.jit.ahead import Ahead
from stoker.loader.read.indexed.group_records import GroupRecords
from stoker.loader.read.staging import StagedRecords

__all__ = ["RowGroups", "all_records", "buffered_records", "plain_records"]

# rows of records plain_records transposes at once: a copy of more than 500 elements gives
# the GIL up (NumPy's NPY_BEGIN_THREADS_THRESHOLDED) and must wait to take it back
_TILE_ROWS = 500
# decoded groups' record buffers kept for reuse (stoker.loader.fastpath.ring: one is written
# again once no kept group and no round views it); made as needed, so a budget of few groups
# holds few
_RECORD_SLOTS = 64
# rows per tile of the kernel (columns_to_records): 256 W1 records are 100 KB, in L2
# (65,536-row W1 group: 7.7 ms at 256, 8.6 at 1,024, 10.3 at 64)
_KERNEL_TILE_ROWS = 256


def all_records(plan: FastPlan) -> bool:
    """Whether every output of ``plan`` can be a row-major record (fixed width or a list):
    only then are indexed Parquet batches served from staging alone."""
    return all(o.kind in ("matrix", "fixed", "list") for o in plan.outputs)


def plain_records(batch: pa.RecordBatch, layout: RecordLayout,
                  slot: Slot | None = None) -> np.ndarray | None:
    """``batch``'s rows as records of ``layout`` (``uint8 [rows, stride]``) when every
    field's columns are plain: no nulls, values of the field's dtype as they are (no cast,
    no dictionary, no bit-packed bools), lists all of the field's width. ``None`` otherwise,
    and the kernels build them (nulls -> 0 and the other rules of
    stoker.loader.fastpath.kernels); where both apply the bytes are the same
    (tests/index/test_row_groups.py). Bytes between fields stay unwritten (a saved file holds
    whatever they held): no output reads them. ``slot``: the ring slot whose buffer they are
    written into (a dropped group's: fresh memory faults in page by page, ~60 ms for a
    65,536-row W1 group on this VM against ~12 ms to write reused memory).

    One call of a nogil kernel writes them
    (:func:`~stoker.loader.fastpath.kernels.columns_to_records`) once it is compiled; until
    then (a fresh node) NumPy does, a column of a tile of rows per call, as follows (same
    bytes: the tests run both). The kernel takes the GIL once per group where NumPy took it
    per call (~300 k calls per 20 M W1 rows), each time waiting behind the training loop.

    A decoded group was packed into one arena for the kernels and each round transposed its
    runs column by column; 5 M W1 rows: 0.4 s packing and 0.9 s of column copies an epoch.
    The columns are written a tile of rows at a time: written whole one after the other, each
    column's pass strode over all of the group's records (26 MB for 65,536 W1 rows) and the
    next pass found none of them in cache (py-spy, 5 M W1 rows indexed: this function was 5.5
    of ~19 s of samples).

    A tile is :data:`_TILE_ROWS` rows, so no column copy gives the GIL up: this runs in a
    decode thread beside a training loop's Python, and each copy that gave the GIL up waited
    for it again behind that thread. With a thread spinning in Python beside it, a 65,536-row
    W1 group took 5.5 s in 668-row tiles and 71 ms in 500-row tiles (14 ms alone either way,
    bench/convoy_bench.py). A list field is copied whole: one wait."""
    n = batch.num_rows
    columns = []
    for f in layout.fields:
        arrays = [batch.column(c) for c in f.columns]
        if any(a.null_count or pa.types.is_dictionary(a.type) or pa.types.is_boolean(a.type)
               for a in arrays):
            return None
        if f.kind == "list":
            a = arrays[0]
            if not (pa.types.is_list(a.type) or pa.types.is_large_list(a.type)):
                return None
            offsets = a.offsets.to_numpy()
            values = a.values
            if values.null_count or pa.types.is_boolean(values.type) or \
                    np.dtype(values.type.to_pandas_dtype()) != f.dtype or \
                    not np.array_equal(offsets - offsets[0],
                                       np.arange(n + 1, dtype=offsets.dtype) * f.width):
                return None
            start = int(offsets[0])
            columns.append((f, [values.to_numpy()[start:start + n * f.width].reshape(n, f.width)]))
        else:
            if any(not (pa.types.is_integer(a.type) or pa.types.is_floating(a.type)) or
                   np.dtype(a.type.to_pandas_dtype()) != f.dtype for a in arrays):
                return None
            columns.append((f, [a.to_numpy() for a in arrays]))
    records = np.empty((n, layout.stride), np.uint8) if slot is None \
        else slot.array("records", (n, layout.stride), np.uint8)
    transpose = aot.serving(k.columns_to_records, "columns_to_records")
    if transpose is not k.columns_to_records or warm.usable(transpose):
        _transpose(transpose, columns, n, records)
        return records
    fixed = []
    for f, values in columns:
        view = records[:, f.offset:f.offset + f.nbytes].view(f.dtype)
        if f.kind == "list":
            view[:] = values[0]
        else:
            fixed.append((view, values))
    for lo in range(0, n, _TILE_ROWS):  # every column of a tile while its records stay in cache
        hi = min(n, lo + _TILE_ROWS)
        for view, values in fixed:
            for j, v in enumerate(values):
                view[lo:hi, j] = v[lo:hi]
    return records


def _transpose(kernel: Callable[..., None], columns: list[tuple[Field, list[np.ndarray]]],
               rows: int, records: np.ndarray) -> None:
    """The columns of :func:`plain_records` into ``records`` by one call of ``kernel``
    (:func:`~stoker.loader.fastpath.kernels.columns_to_records` or its twin compiled ahead
    of time)."""
    addrs, sizes, offsets = [], [], []
    for f, values in columns:
        for j, v in enumerate(values):
            addrs.append(v.ctypes.data)
            sizes.append(v.itemsize * (f.width if f.kind == "list" else 1))
            offsets.append(f.offset + j * f.dtype.itemsize)
    kernel(np.array(addrs, np.int64), np.array(sizes, np.int64), np.array(offsets, np.int64),
           rows, _KERNEL_TILE_ROWS, records.ctypes.data, records.shape[1])


def buffered_records(buffers: BufferRing, batch: pa.RecordBatch,
                     layout: RecordLayout) -> np.ndarray | None:
    """:func:`plain_records` written into a buffer of ``buffers`` (written again once
    nothing views it)."""
    slot = buffers.acquire()
    try:
        return plain_records(batch, layout, slot)
    finally:
        buffers.release(slot)


class RowGroups:
    """Decoded row groups (records or kernel inputs), dropped past ``budget`` bytes in the
    order the rounds read them (:meth:`_victim`), the next one decoded ahead.

    Args:
        read: ``read(file, group)`` -> the group's table (verified, cast to the manifest).
        group_rows: ``group_rows(file)`` -> row count of each row group of ``file``.
        columns: the columns the kernels read.
        opened: called with each decoded group's record batches (fixes the record layout).
        budget: bytes of decoded groups kept.
        layout: the record layout rounds are staged in, once ``opened`` fixed it: a group
            whose columns are plain (:func:`plain_records`) is kept as records in it.
        stored: the node's stored records of groups (stoker.loader.read.indexed.group_records): a
            group found there is mapped, not decoded; a decoded group's records are saved.
    """

    def __init__(self, read: Callable[[int, int], pa.Table],
                 group_rows: Callable[[int], np.ndarray], columns: list[str],
                 opened: Callable[[list[pa.RecordBatch]], None], budget: int,
                 layout: Callable[[], RecordLayout | None] = lambda: None,
                 stored: GroupRecords | None = None) -> None:
        self._read, self._group_rows, self._columns = read, group_rows, columns
        self._opened, self._budget, self._layout = opened, budget, layout
        self.stored = stored
        # (file, group) -> (its kernel inputs or records, bytes, the round that last read it)
        self._kept: OrderedDict[tuple[int, int],
                                tuple[ShardData | StagedRecords, int, int]] = OrderedDict()
        self._bytes = 0
        self._round, self._last = 0, (-1, -1)
        self._lock = threading.Lock()
        self._ahead = Ahead("stoker-decode")  # the group after the one a round read
        self._groups: dict[int, int] = {}  # row groups of each file, asked once
        self._buffers = BufferRing(_RECORD_SLOTS)  # groups' records (plain_records)
        self.decoded = 0  # row groups decoded (statistics: ~ groups per epoch when it fits)

    def _group(self, file: int, group: int) -> ShardData | StagedRecords:
        key = (file, group)
        with self._lock:
            if key <= self._last:  # a round asks for its groups in ascending order
                self._round += 1
            self._last = key
            hit = self._kept.get(key)
            if hit is not None:
                self._kept[key] = (hit[0], hit[1], self._round)
                self._kept.move_to_end(key)
        if hit is None:  # decoding ahead: wait for it (decoding others meanwhile), look again
            self._ahead.wait(key, help=True)
            with self._lock:
                hit = self._kept.get(key)
        data = hit[0] if hit is not None else self._load(key)
        self._decode_ahead((file, group + 1))
        return data

    def _load(self, key: tuple[int, int]) -> ShardData | StagedRecords:
        """Map group ``key``'s stored records, or decode it (saving its records); keep it
        (dropping others past the budget)."""
        data, nbytes = self._mapped(key) or self._decode(key)
        with self._lock:
            self._kept[key] = (data, nbytes, self._round)
            self._bytes += nbytes
            while self._bytes > self._budget and len(self._kept) > 1:
                self._bytes -= self._kept.pop(self._victim(max(key, self._last)))[1]
        return data

    def _mapped(self, key: tuple[int, int]) -> tuple[StagedRecords, int] | None:
        """Group ``key``'s stored records, once a decoded group fixed the layout."""
        layout = self._layout()
        if self.stored is None or layout is None:
            return None
        rows = self._group_rows(key[0])[key[1]]
        records = self.stored.open(key[0], key[1], int(rows), layout)
        if records is None:
            return None
        if isinstance(records, StagedRecords):  # read from its file, past memory
            return records, int(rows) * layout.stride
        return StagedRecords(records), records.nbytes

    def _decode(self, key: tuple[int, int]) -> tuple[ShardData | StagedRecords, int]:
        batches = self._read(*key).combine_chunks().to_batches()
        self._opened(batches)
        layout = self._layout()
        records = buffered_records(self._buffers, batches[0], layout) \
            if layout is not None and len(batches) == 1 else None
        with self._lock:
            self.decoded += 1
        if records is None:  # the kernels read a packed copy, as they read a shard
            return ShardData(batches, None, self._columns), sum(b.nbytes for b in batches)
        if self.stored is not None and layout is not None:
            self.stored.save(key[0], key[1], layout, records)
        return StagedRecords(records), records.nbytes  # rounds copy whole records out of it

    def _decode_ahead(self, key: tuple[int, int], queued: int = 0) -> int:
        """Decode group ``key`` in the background: the group after the one a round just read
        (a partition's cursor enters it next, and a round that waits for a decode stalls the
        batches: 5 M W1 rows at 12 partitions, a round is 12 batches, a group 64 rounds of
        one cursor), or one a round is about to read (:meth:`runs`). Not past the budget,
        counting ``queued`` bytes of groups queued before it; returns the bytes it queued."""
        count = self._groups.get(key[0])
        if count is None:
            count = self._groups[key[0]] = len(self._group_rows(key[0]))
        if key[1] >= count:
            return 0
        layout = self._layout()
        with self._lock:
            if key in self._kept or self._bytes + queued >= self._budget:
                return 0
        self._ahead.start(key, lambda: self._load(key))
        return int(self._group_rows(key[0])[key[1]]) * (layout.stride if layout else 0)

    def close(self) -> None:
        """Stop decoding ahead (a decode under way finishes); kept groups go with this."""
        self._ahead.close()
        if self.stored is not None:
            self.stored.close()

    def _victim(self, current: tuple[int, int]) -> tuple[int, int]:
        """The kept group to drop for room while this round reads ``current``. Not plain
        LRU: every round of a small dataset at many partitions reads every group, in
        ascending order, and LRU over such a cycle misses on every read once the groups
        exceed the budget by one (2 M W1 rows, 31 groups, 29 kept: 279 decodes an epoch).
        In order: a group this round passed over (behind every cursor, as in a large
        dataset's sliding window), least recently used first; then a group this round
        already read, most recently read first (in a cycle, the one needed last again);
        then the group furthest ahead."""
        skipped, read, ahead = [], [], []
        for key, (_, _, used) in self._kept.items():  # least recently used first
            if key == current:
                continue
            (ahead if key > current else read if used == self._round else skipped).append(key)
        if skipped:
            return skipped[0]
        if read:
            return read[-1]
        return max(ahead)

    def runs(self, file: int, first: np.ndarray, end: np.ndarray,
             dest: np.ndarray) -> Iterator[tuple[ShardData | StagedRecords, np.ndarray,
                                                 np.ndarray, np.ndarray]]:
        """Rows ``first[i]:end[i]`` of ``file`` as runs inside its row groups (see
        :class:`~stoker.loader.read.staging.Stager`)."""
        starts = np.concatenate([[0], np.cumsum(self._group_rows(file))]).astype(np.int64)
        lo_group = np.searchsorted(starts, first, side="right") - 1
        hi_group = np.searchsorted(starts, end - 1, side="right") - 1
        groups = [(g, sel) for g in range(int(lo_group.min()), int(hi_group.max()) + 1)
                  if len(sel := np.flatnonzero((lo_group <= g) & (hi_group >= g)))]
        for i, (g, sel) in enumerate(groups):
            data = self._group(file, g)
            if i == 0:  # the others decode meanwhile (the first fixed the layout)
                queued = 0
                for later, _ in groups[1:]:
                    queued += self._decode_ahead((file, later), queued)
            lo = np.maximum(first[sel], starts[g])
            hi = np.minimum(end[sel], starts[g + 1])
            yield data, lo - starts[g], hi - starts[g], dest[sel] + lo - first[sel]
