"""Staging for Parquet indexed in place: rounds copied row-major out of decoded row groups.

An indexed Parquet file cannot be memory-mapped as Arrow: each row group must be decoded.
Staging (:mod:`stoker.loader.read.staging`) reads a round's runs of consecutive rows, and a
partition's next round continues where its last one stopped, so a decoded row group serves
about ``rows per group / K`` consecutive rounds. :class:`RowGroups` keeps the decoded groups
the order's working set needs (``stoker.loader.read.order_plan`` sizes it: at most
``P/W x span(3K)`` groups), as kernel inputs (:class:`~stoker.loader.fastpath.plan.ShardData` over
a packed copy), so each group is decoded about once per epoch.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa

from stoker.loader.fastpath.plan import FastPlan, ShardData

__all__ = ["RowGroups", "all_records"]


def all_records(plan: FastPlan) -> bool:
    """Whether every output of ``plan`` can be a row-major record (fixed width or a list):
    only then are indexed Parquet batches served from staging alone."""
    return all(o.kind in ("matrix", "fixed", "list") for o in plan.outputs)


class RowGroups:
    """Decoded row groups as kernel inputs, least recently used dropped past ``budget`` bytes.

    Args:
        read: ``read(file, group)`` -> the group's table (verified, cast to the manifest).
        group_rows: ``group_rows(file)`` -> row count of each row group of ``file``.
        columns: the columns the kernels read.
        opened: called with each decoded group's record batches (fixes the record layout).
        budget: bytes of decoded groups kept.
    """

    def __init__(self, read: Callable[[int, int], pa.Table],
                 group_rows: Callable[[int], np.ndarray], columns: list[str],
                 opened: Callable[[list[pa.RecordBatch]], None], budget: int) -> None:
        self._read, self._group_rows, self._columns = read, group_rows, columns
        self._opened, self._budget = opened, budget
        # (file, group) -> (its kernel inputs, bytes, the round that last read it)
        self._kept: OrderedDict[tuple[int, int], tuple[ShardData, int, int]] = OrderedDict()
        self._bytes = 0
        self._round, self._last = 0, (-1, -1)
        self._lock = threading.Lock()
        self.decoded = 0  # row groups decoded (statistics: ~ groups per epoch when it fits)

    def _group(self, file: int, group: int) -> ShardData:
        key = (file, group)
        with self._lock:
            if key <= self._last:  # a round asks for its groups in ascending order
                self._round += 1
            self._last = key
            hit = self._kept.get(key)
            if hit is not None:
                self._kept[key] = (hit[0], hit[1], self._round)
                self._kept.move_to_end(key)
                return hit[0]
        batches = self._read(file, group).combine_chunks().to_batches()
        self._opened(batches)
        data = ShardData(batches, None, self._columns)
        nbytes = sum(b.nbytes for b in batches)
        with self._lock:
            self.decoded += 1
            self._kept[key] = (data, nbytes, self._round)
            self._bytes += nbytes
            while self._bytes > self._budget and len(self._kept) > 1:
                self._bytes -= self._kept.pop(self._victim(key))[1]
        return data

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
             dest: np.ndarray) -> Iterator[tuple[ShardData, np.ndarray, np.ndarray, np.ndarray]]:
        """Rows ``first[i]:end[i]`` of ``file`` as runs inside its row groups (see
        :class:`~stoker.loader.read.staging.Stager`)."""
        starts = np.concatenate([[0], np.cumsum(self._group_rows(file))]).astype(np.int64)
        lo_group = np.searchsorted(starts, first, side="right") - 1
        hi_group = np.searchsorted(starts, end - 1, side="right") - 1
        for g in range(int(lo_group.min()), int(hi_group.max()) + 1):
            sel = np.flatnonzero((lo_group <= g) & (hi_group >= g))
            if not len(sel):
                continue
            lo = np.maximum(first[sel], starts[g])
            hi = np.minimum(end[sel], starts[g + 1])
            yield (self._group(file, g), lo - starts[g], hi - starts[g],
                   dest[sel] + lo - first[sel])
