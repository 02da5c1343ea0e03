"""The records of a source's open shards, read by one kernel call per batch.

:class:`RecordTable` maps shard -> records (:mod:`stoker.loader.fastpath.rowmajor`) through a table of
addresses, so :func:`_gather` serves a whole batch from any number of shards without Python
per shard or per output; it prefetches the records of rows ahead so many cache misses are in
flight at once. A fresh process's first batch may use the NumPy twin
(:meth:`RecordTable._gather_numpy`) while the kernel is still loading.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import TYPE_CHECKING, Sequence

import numpy as np

from stoker.loader.jit import aot, warmup
from stoker.loader.jit.intrinsics import pointer, prefetch
from stoker.loader.jit.kernel import compiled, kernel
from stoker.loader.fastpath.rowmajor import Field, RecordLayout
from stoker.loader.jit.search import bucket_index, find_run

if TYPE_CHECKING:
    from stoker.loader.fastpath.ring import Slot

__all__ = ["RecordTable"]

_AHEAD = 16  # rows prefetched ahead by the gather (0.09 ms per W1 batch; 4-32 all within 10 %)


@kernel
def _gather(ids, starts, shift, bucket, addrs, stride,  # type: ignore[no-untyped-def]
            offsets, sizes, out_addrs, out_strides, missing, marks, stamp, touched):
    """Write bytes ``offsets[f]:offsets[f] + sizes[f]`` of sample ``ids[i]``'s record at
    address ``out_addrs[f] + i * out_strides[f]`` (row ``i`` of output ``f``); returns
    ``(m, t)``: ``missing[:m]`` are the batch rows whose shard has no record
    (``addrs[shard] == 0``), ``touched[:t]`` the shards read (``marks`` holds the last
    ``stamp`` that saw each shard). Outputs go by address, not as a tuple of arrays: Numba
    types a tuple argument in Python on every call (~20 us), and one signature then serves
    every layout. ``(shift, bucket)`` is ``starts``'
    :func:`~stoker.loader.jit.search.bucket_index`."""
    n = ids.shape[0]
    src = np.empty(n, dtype=np.int64)
    m = 0
    t = 0
    for i in range(n):
        g = ids[i]
        lo = find_run(starts, shift, bucket, g)
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
        self._bucket: tuple[object, int, np.ndarray] = (None, 0, np.zeros(1, dtype=np.int64))

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

    def _enter(self) -> tuple[int, tuple[tuple[Field, ...], np.ndarray, np.ndarray], int]:
        """Start a read: ``(generation, serving, stamp)``; records retired from now on stay
        mapped until :meth:`_leave` (a context manager cost ~4 us of a ~250 us batch)."""
        with self._lock:
            generation = self._generation
            self._readers[generation] += 1
            self._stamp += 1
            return generation, self._serving, self._stamp

    def _leave(self, generation: int) -> None:
        with self._lock:
            self._readers[generation] -= 1
            if not self._readers[generation]:
                del self._readers[generation]
            self._collect_locked()

    def gather(self, ids: np.ndarray, starts: np.ndarray, slot: Slot, kernel: bool = False,
               numpy: bool = False, jit: bool = False
               ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """Fill the record-served outputs of the batch ``ids`` into ``slot``: by the JIT
        kernel once this process loaded it (or when ``jit``: a warm-up loads it), else by
        the kernel compiled ahead of time when the node has it (stoker.loader.jit.aot: the
        same bytes, without Numba),
        else with NumPy when ``numpy`` (the caller's kernels are not ready) or while the
        kernel is still being loaded by a warm-up thread on a process's first batch (unless
        ``kernel``).

        Returns ``(outputs, missing, touched)``: output name -> array (rows in ``missing``,
        batch positions whose shard has no records, are left for the column path) and the
        shards read.
        """
        n = len(ids)
        generation, (fields, offsets, sizes), stamp = self._enter()
        try:
            if not fields:
                return {}, np.arange(n, dtype=np.int64), np.empty(0, dtype=np.int64)
            arrays = {}
            outs = []
            for f in fields:
                out = arrays[f.name] = slot.array(f.name, (n, f.width), f.dtype)
                outs.append(out.view(np.uint8))
            loaded = compiled(_gather)
            gather = None if jit or loaded else aot.function("record_gather")
            if gather is None and (numpy or (not kernel and warmup.first_call("gather")
                                             and not loaded)):
                missing_, touched_ = self._gather_numpy(ids, starts, fields, outs)
                return arrays, missing_, touched_
            missing = np.empty(n, dtype=np.int64)
            touched = np.empty(n, dtype=np.int64)
            out_addrs = np.array([o.ctypes.data for o in outs], dtype=np.int64)
            out_strides = np.array([o.strides[0] for o in outs], dtype=np.int64)
            if self._bucket[0] is not starts:  # the source's shard starts: one per source
                self._bucket = (starts, *bucket_index(starts))
            _, shift, bucket = self._bucket
            m, t = (gather or _gather)(ids, starts, shift, bucket, self.addrs, self.layout.stride,
                                       offsets, sizes, out_addrs, out_strides, missing,
                                       self._marks, stamp, touched)
        finally:
            self._leave(generation)
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
