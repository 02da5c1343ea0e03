"""Natural-order batches of Parquet indexed in place, copied out of decoded row groups.

Unshuffled, a batch is consecutive rows, mostly of one row group. Read through pyarrow, each
batch took its rows from the decoded group (``Table.take``) and converted them column by
column (``stack_features`` and the other rules of stoker.loader.fastpath.convert): 2 M W1
rows, 0.40 M rows/s, the decode itself a tenth of the time (py-spy). Here each group is
decoded once, transposed into row-major records as staged rounds do
(stoker.loader.read.indexed.row_groups.plain_records) and a batch copies one slice of them
per output: the same bytes as the pyarrow path (tests/index/test_natural_order.py). The
two groups after the one a batch read are loaded ahead in background threads. Groups whose
columns are not plain (nulls, dictionaries, casts) leave their batches to pyarrow.

A decoded group's records are saved in the node's record store, and a group found there is
read from it instead of decoded (stoker.loader.read.indexed.group_records: checked against
the file before it is served), as shuffled runs do: the same records serve both orders, so
a later run decodes only the group that fixes the record layout.

Such a run needs no Numba kernel: nothing is decoded but that one group, the order is
``O[k] = k``, and a batch is one NumPy copy per output. So it never imports Numba, whose
start-up held the GIL ~0.4 s beside the first batches (2 M W1 rows, later runs: 1.79-2.28
-> 2.34-2.66 M rows/s); only a run that decodes a large dataset loads the transpose
kernel (:data:`_KERNEL_ROWS`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa

from stoker.loader.fastpath import warm
from stoker.loader.fastpath.plan import FastPlan
from stoker.loader.fastpath.ring import BufferRing, Slot
from stoker.loader.fastpath.rowmajor import RecordLayout
from stoker.loader.jit.ahead import Ahead
from stoker.loader.read.indexed.group_records import GroupRecords
from stoker.loader.read.indexed.row_groups import buffered_records
from stoker.loader.read.staged_files import FileRecords

__all__ = ["NaturalGroups"]

# record buffers kept for reuse (a kept group's is written again once nothing views it):
# fresh memory faults in page by page, ~5x the cost of writing reused memory (row_groups)
_RECORD_SLOTS = 8
# groups kept at most: batches read groups in file order, so past the one being read, the
# _AHEAD loaded ahead and one behind (thread workers' batches come out of order) a kept group
# is read again only next epoch; more would hold records (and ring slots: a new buffer per
# group, each fresh memory) for nothing (20 M W1 rows in a 6 GiB cgroup, later runs: 2.35 ->
# 2.61-3.09 M rows/s against a 512 MB bound)
_KEPT = 4
# groups loaded ahead at once, each in its own thread: a stored group's check (a few
# columns read from the Parquet file) then overlaps the other's records read (20 M W1 rows
# in a 6 GiB cgroup, later runs: 2.07-2.44 M rows/s with one, 2.67-2.85 M with two)
_AHEAD = 2
# rows an epoch must read before a run that decodes row groups loads Numba and the kernel
# that makes them row-major (stoker.loader.fastpath.warm.prime_columns_to_records): loading
# them holds the GIL ~0.3 s, and the transpose saves ~5 ms a 65,536-row W1 group (a node's first
# natural-order run of W1 rows: 2 M 1.01-1.08 M rows/s loading them against 1.18-1.31 M
# not; 20 M in a 6 GiB cgroup 1.43-1.46 against 1.35). On a node with the kernels compiled
# ahead of time (stoker.loader.jit.aot) no Numba is loaded and the transpose's twin serves
# from the first group
_KERNEL_ROWS = 4_000_000


class NaturalGroups:
    """Decoded row groups' records for natural-order batches: the group batches read and
    those loaded ahead of it, and those behind it within ``budget`` bytes, at most
    :data:`_KEPT` groups (see :meth:`_drop`).

    Args:
        plan: the source's fast plan (every output a record: see ``all_records``).
        read: ``read(file, group)`` -> the group as a table (verified, cast to the
            manifest's types).
        budget: bytes of records kept.
        stored: the node's stored records of row groups (``None``: kept nowhere): a group
            found there is read, not decoded; a decoded group's records are saved.
        rows: rows an epoch reads (this rank's): a run that decodes groups of at least
            :data:`_KERNEL_ROWS` loads the transpose kernel.
    """

    def __init__(self, plan: FastPlan, read: Callable[[int, int], pa.Table],
                 budget: int, stored: GroupRecords | None = None, rows: int = 0) -> None:
        self.plan = plan
        self._read, self._budget, self._rows = read, budget, rows
        self.stored = stored
        self._kept: OrderedDict[tuple[int, int], np.ndarray | None] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._buffers = BufferRing(_RECORD_SLOTS)
        self._ahead = Ahead("stoker-natural", _AHEAD)  # the next groups, decoded ahead
        self.layout: RecordLayout | None = None
        self._whole = False  # whether the layout holds every output of the plan
        self._starts: dict[int, np.ndarray] = {}  # each file's row-group starts
        self._at = (-1, -1)  # the group the latest batch read: those before it go first
        self.decoded = 0  # row groups decoded (statistics)

    def gather(self, file: int, group_rows: Sequence[int], row: int, n: int,
               slot: Slot) -> dict[str, np.ndarray] | None:
        """Outputs of rows ``row .. row + n - 1`` of ``file`` (row groups of
        ``group_rows`` rows) written into ``slot``, or ``None`` when a group's columns are
        not plain or an output is not a record (list lengths that differ)."""
        starts = self._starts.get(file)
        if starts is None:
            starts = self._starts[file] = np.concatenate([[0], np.cumsum(group_rows)])
        group = int(np.searchsorted(starts, row, side="right") - 1)
        arrays: dict[str, np.ndarray] | None = None
        pos = 0
        while pos < n:
            lo, size = row + pos - int(starts[group]), int(group_rows[group])
            if lo >= size:  # an empty group
                group += 1
                continue
            records = self._records(file, group)
            layout = self.layout
            if records is None or layout is None or not self._whole:
                return None
            if arrays is None:
                arrays = {f.name: slot.array(f.name, (n, f.width), f.dtype)
                          for f in layout.fields}
            k = min(n - pos, size - lo)
            for f in layout.fields:
                arrays[f.name][pos:pos + k] = \
                    records[lo:lo + k, f.offset:f.offset + f.nbytes].view(f.dtype)
            pos += k
            group += 1
        for ahead in range(group, min(group + _AHEAD, len(group_rows))):
            self._decode_ahead(file, ahead)
        return arrays

    def _records(self, file: int, group: int) -> np.ndarray | None:
        self._ahead.wait((file, group))  # decoding ahead: its error is this read's
        with self._lock:  # the latest, not the furthest: the next epoch starts at group 0
            self._at = (file, group)
        return self._load((file, group))

    def _load(self, key: tuple[int, int]) -> np.ndarray | None:
        """Group ``key``'s records, stored, kept or decoded."""
        with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                return self._kept[key]
        records = self._stored(key)
        if records is None:
            records = self._decode(key)
        with self._lock:
            if key not in self._kept:
                self._kept[key] = records
                self._bytes += 0 if records is None else records.nbytes
            self._drop(key)
        return records

    def _drop(self, key: tuple[int, int]) -> None:
        """Under the lock: past the budget, drop the kept groups behind the one the latest
        batch read (least recently used first); past :data:`_KEPT` groups, the others too,
        never that group nor ``key`` (just loaded). The group batches read and the
        :data:`_AHEAD` loaded after it stay whatever the budget (sized from the Parquet
        bytes of the order's working set, not from records): plain LRU dropped the group
        being read when a group loaded ahead went over the budget, and it was read and
        checked again (2 M W1 rows, 77 MB for 28 MB groups: 49 opens for 30 stored groups
        an epoch, now 30)."""
        order = list(self._kept)  # least recently used first
        for victim in [k for k in order if k < self._at]:
            if self._bytes <= self._budget and len(self._kept) <= _KEPT:
                return
            self._pop(victim)
        for victim in [k for k in order if k > self._at and k != key]:
            if len(self._kept) <= _KEPT:
                return
            self._pop(victim)

    def _pop(self, key: tuple[int, int]) -> None:
        old = self._kept.pop(key)
        self._bytes -= 0 if old is None else old.nbytes

    def _stored(self, key: tuple[int, int]) -> np.ndarray | None:
        """Group ``key``'s stored records, once a decoded group fixed the layout: mapped, or
        past memory read whole into a reused buffer (a group's batches read all of it)."""
        layout, stored = self.layout, self.stored
        if stored is None or layout is None or not self._whole:
            return None
        file, group = key
        sizes = np.diff(self._starts[file])
        rows = int(sizes[group])
        found = stored.open(file, group, rows, layout)
        if found is None:
            return None
        if group + 1 < len(sizes):
            stored.advise(file, group + 1, int(sizes[group + 1]), layout)
        if not isinstance(found, FileRecords):
            return found
        slot = self._buffers.acquire()
        try:
            with found:
                records = slot.array("records", (rows, layout.stride), np.uint8)
                one = np.zeros(1, dtype=np.int64)
                found.copy_runs(records, one, one + rows, one)
            return records
        finally:
            self._buffers.release(slot)

    def _decode(self, key: tuple[int, int]) -> np.ndarray | None:
        """Group ``key`` decoded into records (``None``: its columns are not plain), which
        are then saved."""
        batches = self._read(*key).combine_chunks().to_batches()
        with self._lock:
            if self.layout is None and batches:
                self.layout = RecordLayout.of(self.plan, batches)
                # every output a field of the records (a list whose lengths differ is not)
                self._whole = self.layout is not None and \
                    {f.name for f in self.layout.fields} == {o.name for o in self.plan.outputs}
            layout = self.layout
            self.decoded += 1
            if self.decoded == 2 and self._rows >= _KERNEL_ROWS:  # a run that decodes
                warm.prime_columns_to_records()
        records = buffered_records(self._buffers, batches[0], layout) \
            if layout is not None and len(batches) == 1 else None
        if records is not None and self.stored is not None and self._whole:
            self.stored.save(key[0], key[1], layout, records)
        return records

    def _decode_ahead(self, file: int, group: int) -> None:
        """Decode the group after the one a batch just read, in the background: the next
        batches read it."""
        key = (file, group)
        with self._lock:
            if key in self._kept:
                return
        self._ahead.start(key, lambda: self._load(key))

    def close(self) -> None:
        """Stop decoding ahead (a decode under way finishes) and saving."""
        self._ahead.close()
        if self.stored is not None:
            self.stored.close()
