"""Staging: each round's blocks copied once, sequentially, into a row-major buffer.

A shuffled epoch reads in rounds (:mod:`stoker.loader.order.working_set`): round ``b`` is block ``b``
of each partition a rank owns, i.e. a few hundred runs of consecutive rows of the
shard-permuted stream. Gathering shuffled rows straight out of columnar shards costs one cache
and TLB miss per column per row, and at terabyte scale a page fault too; so the rows of a round
are first copied **in order** (each column read sequentially: readahead and the hardware
prefetcher do the work) into one record per row (:class:`~stoker.loader.fastpath.rowmajor.RecordLayout`),
and batches then gather whole records out of that buffer with one fused kernel
(:func:`stoker.loader.fastpath.record_table._gather`). The copy uses the column kernels themselves, so
a batch is bitwise equal whichever path serves a row.

Memory is bounded by design: at most :data:`~stoker.loader.order.working_set.STAGED_ROUNDS` buffers of
``P/W x K`` rows each, allocated once and reused. The next round is staged by a background
thread while the current one is read (after an epoch's last round, the first round of the
next epoch, which a loader iterated again reads: 112 ms less at the start of each later epoch
of 5 M W1 rows); a buffer is reused only when no batch reads it.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa

from stoker.loader.fallbacks import note
from stoker.loader.jit import aot, executors, fork_gate
from stoker.loader.jit.search import bucket_index
from stoker.loader.order.epoch import EpochOrder, OrderOptions
from stoker.loader.fastpath.record_table import _gather
from stoker.loader.fastpath.rowmajor import Field, RecordLayout, _allocate, copy_runs
from stoker.loader.order.working_set import STAGED_ROUNDS
from stoker.loader.fastpath.advise import advise_runs

if TYPE_CHECKING:
    from stoker.loader.fastpath.plan import FastPlan, ShardData
    from stoker.loader.fastpath.ring import Slot

__all__ = ["Stager", "StagedRecords", "gather_rounds", "round_table"]


_Key = tuple[int, int, int]  # (epoch, seed, block)
_END = np.iinfo(np.int64).max
_SPLIT_ROWS = 4096  # rows a copy needs per thread before a second thread takes half


class _Round:
    """One staged round: its buffer, its id runs, and who reads it."""

    def __init__(self, key: _Key, buffer: np.ndarray) -> None:
        self.key, self.buffer = key, buffer
        self.ready = False
        self.readers = 0
        self.error: BaseException | None = None
        self.starts = self.addrs = np.empty(0, dtype=np.int64)  # set when ready

    def index(self, gid: np.ndarray, length: np.ndarray, stride: int) -> None:
        """The (start id, record address) table of this round's runs, gaps marked by 0."""
        dest = np.cumsum(length) - length
        addr = self.buffer.ctypes.data + dest * stride
        self.starts = np.stack([gid, gid + length], 1).ravel()
        self.addrs = np.stack([addr, np.zeros_like(addr)], 1).ravel()
        self.table = _table(np.concatenate([[0], self.starts, [_END]]),
                            np.concatenate([[0], self.addrs, [0]]))


def _table(starts: np.ndarray, addrs: np.ndarray) -> tuple[np.ndarray, int, np.ndarray,
                                                          np.ndarray]:
    """A round's lookup table as :func:`_gather` takes it: ``(starts, shift, bucket, addrs)``."""
    return (starts, *bucket_index(starts), addrs)


class Stager:
    """Stages the rounds of one rank's shuffled order and gathers batches from them.

    Args:
        plan: the source's fast plan (what records hold).
        options: resolved, shuffled order options.
        rank, world_size: whose partitions are staged.
        shard_rows, fingerprint: the dataset (its order is rebuilt per epoch and seed).
        starts: global id of each shard's first row (``[shards + 1]``).
        runs_of: ``runs_of(shard, firsts, ends, dests)`` opens what holds rows
            ``firsts[i]:ends[i]`` of ``shard`` and yields ``(ShardData, firsts, ends, dests)``
            in that data's own row numbers (a native shard is one ShardData; an indexed
            Parquet file is one per row group).
        rounds: buffers kept (see :data:`~stoker.loader.order.working_set.STAGED_ROUNDS`).
        stage_ahead: stage the next round in a background thread. Off for shards read
            through a cache: its own prefetcher fetches ahead, and a staging thread waiting
            for cache room would outlive its loader.
        id_offset: added to the ids of the rounds' lookup tables (a mixture's source staged
            on its own, its rows read by their mixture ids: stoker.loader.read.mixture_staging).
    """

    def __init__(self, plan: FastPlan, options: OrderOptions, rank: int, world_size: int,
                 shard_rows: np.ndarray, fingerprint: str, starts: np.ndarray,
                 runs_of: Callable[..., Iterable[tuple[ShardData, np.ndarray, np.ndarray,
                                                       np.ndarray]]],
                 rounds: int = STAGED_ROUNDS, stage_ahead: bool = True,
                 id_offset: int = 0) -> None:
        self._plan, self.options = plan, options
        self.rank, self.world_size = rank, world_size
        self._rows, self._fingerprint, self._starts = shard_rows, fingerprint, starts
        self._runs_of = runs_of
        self._capacity = rounds
        self._id_offset = id_offset
        total = int(np.sum(shard_rows))
        # rows of the largest round: the rank's partitions, each at most one block
        self._round_rows = -(-options.partitions // world_size) * \
            min(options.block_size, -(-total // options.partitions))
        self.layout: RecordLayout | None = None
        self._misfit_fields: set[str] = set()
        self._ahead = False
        self._closed = False
        self.stage_ahead = stage_ahead
        self._cond = threading.Condition()
        self._reset()
        self.staged_rows = 0  # rows copied so far (statistics)
        self.rounds_staged = 0

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._rounds: dict[_Key, _Round] = {}
        self._free: list[np.ndarray] = []
        self._buffers = 0
        self._orders: dict[tuple[int, int], EpochOrder] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._helper: ThreadPoolExecutor | None = None  # copies half of each shard's runs

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        for name in ("_cond", "_rounds", "_free", "_orders", "_pool", "_helper"):
            state.pop(name)
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._cond = threading.Condition()
        self._reset()

    def _check_process(self) -> None:
        if os.getpid() != self._pid:  # a forked worker: nothing of the parent's is usable
            self._cond = threading.Condition()
            self._reset()

    # -- layout -------------------------------------------------------------------------------
    def opened(self, batches: Sequence[pa.RecordBatch]) -> None:
        """A shard opened: fix the layout on the first; list outputs whose width differs in a
        later shard stop being served from records (for every batch: one width per batch)."""
        with self._cond:
            if self.layout is None:
                self.layout = RecordLayout.of(self._plan, batches)
            if self.layout is not None:
                self._misfit_fields.update(self.layout.misfits(batches))
            # Stage ahead only when records serve every output: then shards are read only by
            # staging, in round order, which is the future the cache evicts by. Outputs read
            # from the shards at batch time (images, strings, ragged lists) would read a
            # round's shards two rounds after staging did, which that future does not show.
            served = {f.name for f in self.fields}
            self._ahead = all(o.name in served for o in self._plan.outputs)

    @property
    def fields(self) -> tuple[Field, ...]:
        """The fields batches are served from staging."""
        if self.layout is None:
            return ()
        return tuple(f for f in self.layout.fields if f.name not in self._misfit_fields)

    # -- rounds -------------------------------------------------------------------------------
    def order(self, epoch: int, seed: int) -> EpochOrder:
        with self._cond:
            order = self._orders.get((epoch, seed))
            if order is None:
                order = EpochOrder(self._rows, self._fingerprint, seed, epoch, self.options)
                self._orders = {**dict(list(self._orders.items())[-1:]), (epoch, seed): order}
            return order

    def _victim(self, keep: set[_Key], key: _Key) -> _Round | None:
        idle = [r for r in self._rounds.values()
                if r.ready and not r.readers and r.key not in keep]
        if not idle:
            return None
        other = [r for r in idle if r.key[:2] != key[:2]]
        before = [r for r in idle if r.key[:2] == key[:2] and r.key[2] < key[2]]
        if other or before:
            return (other or sorted(before, key=lambda r: r.key[2]))[0]
        return max(idle, key=lambda r: r.key[2])

    def _claim(self, key: _Key, keep: set[_Key], wait: bool) -> _Round | None:
        """Under the lock: a new round for ``key`` with a buffer, evicting an idle round if
        all buffers are in use; ``None`` when none can be had and ``wait`` is false."""
        while True:
            if self._free:
                buffer = self._free.pop()
            elif self._buffers < self._capacity:
                self._buffers += 1
                buffer = np.empty(0, dtype=np.uint8)  # allocated outside the lock
            else:
                victim = self._victim(keep, key)
                if victim is None:
                    if not wait:
                        return None
                    self._cond.wait()
                    if key in self._rounds:
                        return None
                    continue
                del self._rounds[victim.key]
                buffer = victim.buffer
            r = self._rounds[key] = _Round(key, buffer)
            return r

    def _ensure(self, order: EpochOrder, key: _Key, keep: set[_Key], wait: bool = True) -> None:
        with self._cond:
            while True:
                r = self._rounds.get(key)
                if r is None:
                    r = self._claim(key, keep, wait)
                    if r is None:
                        if not wait:
                            return
                        continue
                    break
                if r.ready:
                    return
                if r.error is not None:  # staging it ahead failed: that error, for this batch
                    del self._rounds[key]
                    raise r.error
                if not wait:
                    return
                self._cond.wait()
        try:
            self._build(order, r)
        except BaseException as exc:
            with self._cond:
                self._free.append(r.buffer)
                if wait:
                    self._rounds.pop(key, None)
                else:  # staged ahead: the batch that needs the round raises this error
                    r.error = exc
                self._cond.notify_all()
            if wait:
                raise
        with self._cond:
            r.ready = True
            self._cond.notify_all()

    def _build(self, order: EpochOrder, r: _Round) -> None:
        gid, length = order.block_ranges(r.key[2], self.rank, self.world_size)
        shard = np.searchsorted(self._starts, gid, side="right") - 1
        dest0 = np.cumsum(length) - length
        per_shard = []
        for s in np.unique(shard).tolist():
            sel = np.flatnonzero(shard == s)
            first = gid[sel] - self._starts[s]
            per_shard.append((s, first, first + length[sel], dest0[sel]))
        # the first shard opened fixes the layout; later ones open one at a time, so a small
        # cache limit suffices
        first_runs = list(self._runs_of(*per_shard[0])) if per_shard else []
        layout = self.layout
        if layout is None:  # no output fits a record (e.g. only images): nothing to stage
            r.index(gid[:0], length[:0], 0)
            return
        total = int(length.sum())
        if r.buffer.size < max(total, self._round_rows) * layout.stride:
            r.buffer = _allocate(max(total, self._round_rows), layout.stride, np.dtype(np.uint8))
        rec = r.buffer.reshape(-1, layout.stride)
        fields = [f for f in layout.fields if f.name not in self._misfit_fields]
        helper = self._copy_helper()
        # runs read from files are all asked of the kernel first and copied last: read one
        # group's after another, the disk had one read queued at a time (20 M W1 rows of
        # indexed Parquet in a 6 GiB cgroup, later runs: 1.28-1.31 -> 1.49-1.67 M rows/s)
        files = []
        for i, args in enumerate(per_shard):
            for run in first_runs if i == 0 else self._runs_of(*args):
                if isinstance(run[0], StagedRecords) and run[0].advise(run[1], run[2]):
                    files.append(run)
                else:
                    _copy(rec, fields, *run, helper=helper)
        for d, first, end, dest in files:
            d.copy_runs(rec, first, end, dest, advised=True)
        r.index(gid + self._id_offset, length, layout.stride)
        self.staged_rows += total
        self.rounds_staged += 1

    def _copy_helper(self) -> ThreadPoolExecutor | None:
        """A second thread for a round's copies where there is a second core: the copies
        are nogil kernels, and one staging thread alone bounded shuffled epochs past the
        records budget (bench/gil_bench.py, "staged")."""
        if (os.cpu_count() or 1) < 2:
            return None
        with self._cond:
            if self._helper is None:
                self._helper = ThreadPoolExecutor(1, thread_name_prefix="stoker-staging-copy")
            return self._helper

    def _prefetch(self, order: EpochOrder, key: _Key, keep: set[_Key]) -> None:
        if key[2] >= order.blocks_per_partition():
            return
        with self._cond:
            if key in self._rounds:
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="stoker-staging")
            pool = self._pool
        pool.submit(self._background, order, key, keep)

    def _background(self, order: EpochOrder, key: _Key, keep: set[_Key]) -> None:
        if not self._closed:
            with fork_gate.unit():  # reads shards through pyarrow: not split by a fork
                self._ensure(order, key, keep, wait=False)  # an error is kept in the round

    # -- batches ------------------------------------------------------------------------------
    def gather(self, ids: np.ndarray, slot: Slot, epoch: int, seed: int,
               most: int | None = None) -> tuple[dict[str, np.ndarray], np.ndarray] | None:
        """Write the staged fields of batch ``ids`` into ``slot``: ``(outputs, missing)``,
        ``missing`` the batch rows not served (fields whose list width differs in some shard
        are left out of ``outputs`` altogether); ``None`` when ``ids`` span more than
        ``most`` rounds (a group of batches: read it batch by batch)."""
        self._check_process()
        order = self.order(epoch, seed)
        # the loader's ids come in position order and a batch's positions are consecutive:
        # its blocks are those from its first id's to its last id's
        first, last = order.block_of(ids[[0, -1]]).tolist()
        if last < first:  # not in position order: ids a caller chose
            blocks = order.block_of(ids)
            first, last = int(blocks.min()), int(blocks.max())
        if most is not None and last - first >= most:
            return None
        if last - first >= self._capacity:  # staging them would wait for a free buffer forever
            note("ids_not_staged", f"batch of {len(ids)} samples from rounds {first}-{last} "
                                   f"of epoch {epoch} (at most {self._capacity} are staged)")
            return {}, np.arange(len(ids), dtype=np.int64)
        keys = [(epoch, seed, b) for b in range(first, last + 1)]
        rounds = self.hold(keys)
        try:
            layout = self.layout
            assert layout is not None  # noqa: S101 - rounds exist only with a layout
            outputs, missing = gather_rounds(ids, rounds, slot, layout, self.fields)
        finally:
            self.release(rounds)
        self.stage_next(order, keys[-1][2], set(keys))
        return outputs, missing

    def stage_next(self, order: EpochOrder, block: int, keep: set[_Key]) -> None:
        """Stage the round after ``block`` of ``order`` in the background (after an epoch's
        last round, the next epoch's first), keeping the rounds ``keep`` meanwhile."""
        if not (self._ahead and self.stage_ahead):
            return
        nxt = (order.epoch, order.seed, block + 1)
        if nxt[2] >= order.blocks_per_partition():  # the last round: the next epoch's
            nxt = (order.epoch + 1, order.seed, 0)  # first one, so that epoch does not start waiting
            order = self.order(order.epoch + 1, order.seed)
        self._prefetch(order, nxt, keep | {nxt})

    def hold(self, keys: list[_Key]) -> list[_Round]:
        """Rounds ``keys`` (``(epoch, seed, block)``), staged (waiting for them) and held for
        reading until :meth:`release`; at most :attr:`capacity` keys."""
        self._check_process()
        keep = set(keys)
        while True:
            for key in keys:
                self._ensure(self.order(key[0], key[1]), key, keep)
            with self._cond:
                rounds = [self._rounds.get(key) for key in keys]
                if all(r is not None and r.ready for r in rounds):
                    for r in rounds:
                        r.readers += 1  # type: ignore[union-attr]
                    return rounds  # type: ignore[return-value]

    def staged(self, key: _Key) -> bool:
        """Whether round ``key`` is staged now (it may be dropped for another at any time)."""
        with self._cond:
            r = self._rounds.get(key)
            return r is not None and r.ready

    def release(self, rounds: list[_Round]) -> None:
        """The reads of :meth:`hold`'s rounds are done: their buffers may be staged again."""
        with self._cond:
            for r in rounds:
                r.readers -= 1
            self._cond.notify_all()

    @property
    def capacity(self) -> int:
        """Rounds staged at once (so at most this many held by one batch)."""
        return self._capacity

    def close(self) -> None:
        """Stop staging ahead; buffers are freed with the stager."""
        self._closed = True
        with self._cond:
            pool, self._pool = self._pool, None
            helper, self._helper = self._helper, None
        if self._pid == os.getpid():
            for p in (pool, helper):
                if p is not None:
                    executors.stop(p)


def round_table(rounds: Sequence[_Round]) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
    """The lookup table of several rounds at once, as :func:`_gather` takes it."""
    starts = np.concatenate([r.starts for r in rounds])
    addrs = np.concatenate([r.addrs for r in rounds])
    o = np.lexsort((addrs != 0, starts))  # a run's start sorts after an equal gap end
    return _table(np.concatenate([[0], starts[o], [_END]]), np.concatenate([[0], addrs[o], [0]]))


def gather_rounds(ids: np.ndarray, rounds: Sequence[_Round], slot: Slot, layout: RecordLayout,
                  fields: Sequence[Field], table: tuple[Any, ...] | None = None
                  ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Write ``fields`` of the rows ``ids`` from the staged ``rounds`` (any that holds an id
    serves it: its bytes depend on the id only) into ``slot``: ``(outputs, missing)``,
    ``missing`` the batch rows no round holds (every row when there are no fields).
    ``table``: the rounds' :func:`round_table`, when the caller kept it."""
    n = len(ids)
    if table is None:
        table = rounds[0].table if len(rounds) == 1 else round_table(rounds)
    starts, shift, bucket, addrs = table
    arrays = {f.name: slot.array(f.name, (n, f.width), f.dtype) for f in fields}
    outs = [arrays[f.name].view(np.uint8) for f in fields]
    missing = np.empty(n, dtype=np.int64)
    if not fields:
        return arrays, np.arange(n, dtype=np.int64)
    gather = aot.serving(_gather, "record_gather", ids, starts, bucket, addrs)
    m, _ = gather(ids, starts, shift, bucket, addrs, layout.stride,
                  np.array([f.offset for f in fields], dtype=np.int64),
                  np.array([f.nbytes for f in fields], dtype=np.int64),
                  np.array([o.__array_interface__["data"][0] for o in outs], dtype=np.int64),
                  np.array([o.strides[0] for o in outs], dtype=np.int64), missing,
                  np.zeros(len(starts), dtype=np.int64), 1, np.empty(n, dtype=np.int64))
    return arrays, missing[:m]  # none unless a round lacks an id: the column path


class StagedRecords:
    """Rows already laid out as this stager's records (``uint8 [rows, stride]``): a decoded
    Parquet row group, transposed once when it is decoded (stoker.loader.read.indexed.row_groups),
    so a round's runs are copied out whole instead of column by column."""

    def __init__(self, records: np.ndarray) -> None:
        self.records = records

    def advise(self, first: np.ndarray, end: np.ndarray) -> bool:
        """Ask for rows ``first[i]:end[i]`` to be read now, ahead of :meth:`copy_runs`;
        whether that means anything (records read from a file: :class:`FileRecords`)."""
        return False

    def copy_runs(self, rec: np.ndarray, first: np.ndarray, end: np.ndarray,
                  dest: np.ndarray, advised: bool = False) -> None:
        """Rows ``first[i]:end[i]`` -> ``rec[dest[i]...]`` (``advised``: :meth:`advise`
        asked for them already)."""
        for lo, hi, to in zip(first.tolist(), end.tolist(), dest.tolist()):
            rec[to:to + hi - lo] = self.records[lo:hi]


def _copy(rec: np.ndarray, fields: Sequence[Field], d: ShardData | StagedRecords,
          first: np.ndarray, end: np.ndarray, dest: np.ndarray,
          helper: ThreadPoolExecutor | None = None) -> None:
    """Rows ``first[i]:end[i]`` of ``d`` -> records ``dest[i]...`` of ``rec``, every field;
    the pages read are advised first (all read at once, nothing around them). With a
    ``helper`` thread, it copies the second half of the rows meanwhile."""
    if isinstance(d, StagedRecords):
        d.copy_runs(rec, first, end, dest)
        return
    advise_runs(d, fields, first, end)
    rows = int((end - first).sum())
    if helper is None or rows < 2 * _SPLIT_ROWS:
        copy_runs(rec, fields, d, first, end, dest)
        return
    (a, b) = _halves(first, end, dest, rows // 2)
    other = helper.submit(copy_runs, rec, fields, d, *b)
    try:
        copy_runs(rec, fields, d, *a)
    finally:
        other.result()


def _halves(first: np.ndarray, end: np.ndarray, dest: np.ndarray,
            at: int) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]:
    """Runs ``first[i]:end[i]`` (to ``dest[i]``) cut into the first ``at`` rows and the rest,
    the run that holds row ``at`` split in two."""
    length = end - first
    i = int(np.searchsorted(np.cumsum(length), at, side="right"))
    cut = at - int(length[:i].sum())  # rows of run i that go to the first half
    head = (np.append(first[:i], first[i]), np.append(end[:i], first[i] + cut),
            np.append(dest[:i], dest[i]))
    tail = (np.concatenate([[first[i] + cut], first[i + 1:]]), end[i:],
            np.concatenate([[dest[i] + cut], dest[i + 1:]]))
    return head, tail
