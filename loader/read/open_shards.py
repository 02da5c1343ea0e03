"""The shards a source holds open: memory-mapped Arrow files, each keeping the context its
opener entered (a cache pin), at most ``max_open`` at a time, least recently used closed first.

Kept apart from :class:`~stoker.loader.read.arrow.ArrowSource`, which reads batches from them,
so the bound on open shards (and on the cache pins behind them, however many threads read) is
one small class behind one lock. A shard's record batches are checked against the manifest
once, when it opens, so the kernels' raw reads are in range by construction.

A shard whose row-major records the node stored is opened for them only (advised
``MADV_RANDOM``: pyarrow reads its messages, the records check its sampled rows): its columns
serve no batch, and reading them whole beside the records doubled what a cold first batch
read (2 M W1 rows, page cache dropped: 1.6 GB before the first batch, 0.8 GB now). The local
shards one gather needs are opened by a few threads at once: each open waits on the disk.

In natural order a reader in this process (the reader thread of ``num_workers=0``, thread
workers) reads one shard after another, and the first batch of each shard opened it: mapping
its file, parsing its layout, mapping and checking its stored records, at every shard
boundary in the reader's own time (2 M W1 rows, a later natural run without workers: ~25 ms
of each shard's ~50 ms), and longer where the file comes from the disk. So when
natural-order tasks are handed out, the shard after the one they end in (and those they read
that are not open, where shards are small) is opened by one background thread
(``stoker-next-shard``, :class:`NextShard`) while the current shard's batches are read; the
batch that reaches it finds it open, or waits for that open (a shard opens once). A shard
opening early also starts its records' build early on a node's first run. Shuffled batches
need every shard from the first batch on (which opens them all, several at once:
:meth:`OpenShards.open_all`). Worker processes get their shards opened by the loader's
process (``ArrowSource.open_for_workers``): before they fork in the thread that forks them,
after it in that background thread (:meth:`NextShard.open_soon`). A shard that cannot be
opened ahead is the counted fallback ``"open_ahead_failed"``: the batch that reaches it
opens it again and raises the error there, naming the shard.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa

from stoker.loader.errors import WorkerError
from stoker.loader.fallbacks import note
from stoker.loader.fastpath.advise import (advise_list_offsets, advise_open, advise_random,
                                           advise_whole)
from stoker.loader.fastpath.ipc_meta import FileBatches, batch_rows
from stoker.loader.fastpath.plan import NotZeroCopy, ShardData, _kind
from stoker.loader.jit import executors, fork_gate
from stoker.manifest import Manifest, ShardIntegrityError

__all__ = ["OPENERS", "NextShard", "OpenShards", "ShardOpener"]

logger = logging.getLogger(__name__)

OPENERS = 4  # threads opening one batch's local shards at once

ShardOpener = Callable[[int], AbstractContextManager[str]]
"""Opens shard ``index`` and yields a local path that stays valid inside the context."""


class OpenShards:
    """Shards of ``manifest`` opened through ``opener``, as tables of ``columns``.

    Args:
        manifest: the dataset.
        columns: the columns each shard's table keeps.
        opener: how to get a local file for a shard; its context stays entered while the
            shard is open.
        max_open: shards open, or being opened, at once.
        lock: the reader's lock (its condition also wakes threads waiting for a slot).
        shard_data: the kernel inputs of a shard's batches and file, or ``None`` when it is
            not zero-copy.
        describe: how messages name a shard.
        opened: called with ``(index, data, batches)`` after a zero-copy shard opened; returns
            whether stored records serve every output of the shard (its columns stay unread).
        dropped: called with the index of a shard being closed, under ``lock``.
        openers: threads opening one gather's shards at once (local files: each open waits
            on the disk; through a cache, its own prefetch threads fetch ahead).
        stored: whether shard ``index``'s records are likely stored on the node: such a shard
            is opened advised ``MADV_RANDOM``, reading its metadata only (a 250 MB W1
            shard's columns are otherwise read whole by the kernel's read-around, beside the
            records that serve its batches); advised back when ``opened`` says the columns
            are needed after all.

    Attributes:
        data: kernel inputs of each open shard (``None``: not zero-copy).
        opened_shards: every shard opened so far.
    """

    def __init__(self, manifest: Manifest, columns: list[str], opener: ShardOpener,
                 max_open: int, lock: threading.Condition, *,
                 shard_data: Callable[[Sequence[pa.RecordBatch], pa.Buffer], ShardData | None],
                 describe: Callable[[int], str],
                 opened: Callable[[int, ShardData, Sequence[pa.RecordBatch]], bool],
                 dropped: Callable[[int], None], openers: int = 1,
                 stored: Callable[[int], bool] = lambda index: False) -> None:
        self.manifest = manifest
        self._columns = columns
        self._opener = opener
        self._max_open = max_open
        self._lock = lock
        self._shard_data = shard_data
        self._describe = describe
        self._on_opened = opened
        self._on_dropped = dropped
        self._stored = stored
        self._openers = openers
        self._open: OrderedDict[int, tuple[pa.Table | FileBatches, AbstractContextManager[str]]] \
            = OrderedDict()
        self._opening: set[int] = set()  # shards being opened (pinned) by some thread now
        self.data: dict[int, ShardData | None] = {}
        self.opened_shards: set[int] = set()
        #: shards are read at random (staged rounds) and do not fit in memory: each map is
        #: advised ``MADV_RANDOM`` before pyarrow reads it (stoker.loader.fastpath.advise)
        self.random_access = False

    def table(self, index: int) -> pa.Table:
        """Shard ``index`` as a table, opening (and pinning) it if needed (see :meth:`open`)."""
        return self._table_of(self._opened(index))

    def open(self, index: int) -> None:
        """Open (and pin) shard ``index`` unless it is open, without reading its record
        batches (see :meth:`_opened`)."""
        self._opened(index)

    def _opened(self, index: int) -> pa.Table | FileBatches:
        """Shard ``index``'s table, or its batches read when first asked for, opening (and
        pinning) it if needed.

        Open shards plus shards being opened never exceed ``max_open``: the oldest open shard
        is closed (its cache pin released) *before* a new one is pinned, and concurrent
        openers of the same shard wait for the first, so the pins a cache sees stay bounded
        however many worker threads read.
        """
        closing = []
        with self._lock:
            while True:
                entry = self._open.get(index)
                if entry is not None:
                    self._open.move_to_end(index)
                    return entry[0]
                if index not in self._opening:
                    if len(self._open) + len(self._opening) < self._max_open:
                        break
                    if self._open:
                        closing.append(self._evict_oldest_locked())
                        continue
                self._lock.wait()
            self._opening.add(index)
        try:
            for h in closing:
                h.__exit__(None, None, None)
            table, data, batches, handle = self._open_shard(index)
            try:  # before other threads can read it (a staging round uses its layout), with
                if data is not None:  # its data current (the records built check that)
                    with self._lock:
                        self.data[index] = data
                    served = self._on_opened(index, data, batches)
                    if data.random_advised and not self.random_access and not served:
                        data.random_advised = not advise_whole(data.arena)
            except BaseException:
                with self._lock:
                    self.data.pop(index, None)
                handle.__exit__(None, None, None)
                raise
        except BaseException:
            with self._lock:
                self._opening.discard(index)
                self._lock.notify_all()
            raise
        with self._lock:
            self._opening.discard(index)
            self.opened_shards.add(index)
            self._open[index] = (table, handle)
            self.data[index] = data
            self._lock.notify_all()
        return table

    def data_of(self, index: int) -> ShardData:
        """Kernel inputs of shard ``index``, opening it if needed; :class:`NotZeroCopy` when
        the shard cannot be read in place (e.g. compressed)."""
        self.open(index)
        data = self.data.get(index)
        if data is None:
            raise NotZeroCopy(f"shard {index} is not zero-copy")
        return data

    def open_all(self, shards: list[int],
                 failed: Callable[[int, Exception], None] | None = None) -> bool:
        """Open the ``shards`` that are not open, several at once (a batch's first gather
        waits for them all, and each open waits on the disk: its messages' pages, its
        records' file); whether there were any. ``failed(index, error)`` takes a shard
        that cannot be opened (``WorkerError``, ``ShardIntegrityError``) instead of raising."""
        closed = [s for s in shards if s not in self._open]
        exempt = fork_gate.exempt()  # the helpers work for this thread, which waits for them

        def one(index: int) -> None:
            with fork_gate.on_behalf(exempt):
                try:
                    self.open(index)
                except (WorkerError, ShardIntegrityError) as exc:
                    if failed is None:
                        raise
                    failed(index, exc)

        if len(closed) > 1 and self._openers > 1:
            with ThreadPoolExecutor(min(len(closed), self._openers),
                                    thread_name_prefix="stoker-open") as pool:
                for _ in pool.map(one, closed):
                    pass
        else:
            for s in closed:
                one(s)
        return bool(closed)

    @property
    def max_open(self) -> int:
        """Shards open, or being opened, at once at most."""
        return self._max_open

    def is_open(self, index: int) -> bool:
        """Whether shard ``index`` is open or being opened: a hint, unlocked, that may
        change right after."""
        return index in self._open or index in self._opening

    def close(self, index: int) -> None:
        """Close shard ``index`` if it is open (its handle exited: a cache pin released)."""
        with self._lock:
            if index not in self._open:
                return
            handle = self._drop_locked(index)
        handle.__exit__(None, None, None)

    def touch(self, shards: np.ndarray) -> None:
        """Mark open ``shards`` as just used (a records read uses them without :meth:`table`)."""
        with self._lock:
            for s in shards.tolist():
                if s in self._open:
                    self._open.move_to_end(s)

    def detach(self) -> list[AbstractContextManager[str]]:
        """Forget every open shard; returns their handles, for the caller to exit once nothing
        reads the shards any more (see :meth:`release`)."""
        with self._lock:
            entries = list(self._open.values())
            self._open.clear()
            self.data.clear()
        return [handle for _, handle in entries]

    @staticmethod
    def release(handles: list[AbstractContextManager[str]]) -> None:
        """Exit the handles :meth:`detach` returned (releasing their cache pins)."""
        for handle in handles:
            handle.__exit__(None, None, None)

    def _evict_oldest_locked(self) -> AbstractContextManager[str]:
        """Drop the least recently used open shard; returns its handle to close unlocked."""
        return self._drop_locked(next(iter(self._open)))

    def _drop_locked(self, index: int) -> AbstractContextManager[str]:
        """Drop open shard ``index``; returns its handle to close unlocked."""
        _, handle = self._open.pop(index)
        self.data.pop(index, None)
        self._on_dropped(index)
        self._lock.notify_all()
        return handle

    def _open_shard(self, index: int) -> tuple[pa.Table | FileBatches, ShardData | None,
                                               Sequence[pa.RecordBatch],
                                               AbstractContextManager[str]]:
        # The opener's context (a cache pin) stays entered while the shard is open here.
        handle = self._opener(index)
        path = handle.__enter__()
        try:
            source = pa.memory_map(path, "r")
            arena = source.read_buffer(source.size())  # zero-copy view of the whole file
            # before pyarrow's reads: with the kernel's read-around they bring in the whole
            # file (a 249 MB shard 100 % resident after read_all; 3.5 % when advised first)
            lean = not self.random_access and self._stored(index)
            random_advised = (self.random_access or lean) and advise_random(arena)
            if random_advised:  # what the layout reads next: in flight together, not in turn
                advise_open(arena)
            # the file's own layout, not pyarrow's record batches: those are read when the
            # Arrow path asks for them (stoker.loader.fastpath.ipc_meta.FileBatches)
            opened = FileBatches.open(arena)
            schema = opened.schema
            if isinstance(opened, FileBatches):
                batches: Sequence[pa.RecordBatch] = opened
                schema.empty_table().select(self._columns)  # a column it lacks: named now
                table: pa.Table | FileBatches = opened
            else:
                batches, table = opened.to_batches(), opened.select(self._columns)
            self._check_batches(index, batch_rows(batches))
            data = self._shard_data(batches, arena)
            if data is not None:
                data.mapped, data.random_advised = True, random_advised
                if random_advised and not lean:  # the layout's check reads every list's offsets
                    advise_list_offsets(data, [f.name for f in schema if f.name in
                                               self._columns and _kind(f.type) == "list"])
            if data is None and self.manifest.compression != "none":
                if lean and random_advised:
                    advise_whole(arena)
                table = self._table_of(table).combine_chunks()  # decompressed once, not per take
        except (OSError, pa.ArrowException) as exc:  # an unreadable file: name the shard
            handle.__exit__(None, None, None)
            raise WorkerError(f"opening {self._describe(index)} failed: {type(exc).__name__}: "
                              f"{exc}; run `stoker verify` on the dataset.") from exc
        except BaseException:
            handle.__exit__(None, None, None)
            raise
        return table, data, batches, handle

    def _table_of(self, opened: pa.Table | FileBatches) -> pa.Table:
        """An open shard's table of the columns (read from its file at the first ask)."""
        return opened if isinstance(opened, pa.Table) else opened.table(self._columns)

    def _check_batches(self, index: int, rows: np.ndarray) -> None:
        """The shard's record batches must hold the rows the manifest lists, batch by batch.

        Global ids are located with the manifest's row counts and then read by the kernels
        through raw pointers; a file whose batches disagree (stale, swapped, a manifest
        rewritten with a recomputed fingerprint) would send row indices past the end of a
        batch's buffers. Checked once per open, so every later read is in range by
        construction (FastPlan.groups checks each batch's rows against it too).
        """
        actual = [r for r in rows.tolist() if r]
        listed = [r for r in self.manifest.shards[index].batch_rows if r]
        if actual != listed:
            info = self.manifest.shards[index]
            raise ShardIntegrityError(
                f"{self._describe(index)} holds record batches of {_runs(actual)} rows "
                f"({sum(actual)} in all), the manifest lists {_runs(listed)} ({info.rows} in "
                "all): the file and the manifest disagree. Run `stoker verify` and restore the "
                "shard, or re-create the dataset with `stoker shard`.", shard=info.path)


def _runs(rows: list[int]) -> str:
    """Row counts as ``16 x 3 + 10`` (messages)."""
    out: list[list[int]] = []
    for r in rows:
        if out and out[-1][0] == r:
            out[-1][1] += 1
        else:
            out.append([r, 1])
    return " + ".join(f"{r} x {n}" if n > 1 else str(r) for r, n in out) or "no"


#: fewest shards the source may hold open for one to open ahead: opening one more closes the
#: least recently used, which with fewer could be the shard being read (a node cache whose
#: limit holds two or three shards: stoker.loader.read.remote.pin_bound)
_MIN_OPEN = 3


class NextShard:
    """Called with the tasks handed out (``ids`` arrays, in order): when the last is a run of
    ids at one stride (natural order, or a rank's share of it), opens in the background the
    shards they read that are not open yet and the shard after them, once a batch has opened
    one (the first batches' opens come first).

    Args:
        shards: the source's open shards.
        starts: the first global id of each shard, then the number of rows.
    """

    def __init__(self, shards: OpenShards, starts: np.ndarray) -> None:
        self._shards, self._starts = shards, starts
        self._lock = threading.Lock()
        self._asked: set[int] = set()  # shards being opened ahead now
        self._pool: tuple[int, ThreadPoolExecutor] | None = None  # (pid that started it, pool)
        self._closed = False
        self.opened = 0  # shards this opened (statistics, tests)

    def __call__(self, ids: Sequence[np.ndarray]) -> None:
        if not len(ids) or not len(ids[0]) or not len(ids[-1]) or \
                not self._shards.opened_shards or self._shards.max_open < _MIN_OPEN:
            return  # the first batch opens its shards itself
        last = ids[-1]
        # ids at one stride (a rank's share of natural order): the ends and the first step
        # only, a hint that runs for every task handed out
        step = int(last[1]) - int(last[0]) if len(last) > 1 else 1
        if step < 1 or int(last[-1]) - int(last[0]) != (len(last) - 1) * step:
            return
        first = int(np.searchsorted(self._starts, ids[0][0], side="right")) - 1
        following = int(np.searchsorted(self._starts, last[-1], side="right"))
        self.open_soon(range(first, min(following + 1, len(self._starts) - 1)))

    def open_soon(self, shards: Sequence[int]) -> None:
        """Open ``shards`` (those not open yet) in the background thread, in order."""
        wanted = [s for s in shards if not self._shards.is_open(s)]
        if not wanted:
            return
        with self._lock:
            wanted = [s for s in wanted if s not in self._asked]
            if self._closed or not wanted:
                return
            self._asked.update(wanted)
            if self._pool is None or self._pool[0] != os.getpid():
                self._pool = (os.getpid(),  # a forked child starts its own
                              ThreadPoolExecutor(1, thread_name_prefix="stoker-next-shard"))
            pool = self._pool[1]
        for index in wanted:
            try:
                done = pool.submit(self._open, index)
            except RuntimeError:  # closed meanwhile (or the interpreter exits): none ahead
                with self._lock:
                    self._asked.difference_update(wanted)
                return
            done.add_done_callback(self._failed)

    def _open(self, index: int) -> None:
        try:
            with fork_gate.unit():  # pyarrow's locks: no fork in the middle
                self._shards.open(index)
            with self._lock:
                closed = self._closed
            if closed:  # the source closed meanwhile: not left open behind it
                self._shards.close(index)
                return
            self.opened += 1
        except (WorkerError, ShardIntegrityError) as exc:  # raised by its batch, in turn
            note("open_ahead_failed", f"shard {index}: {type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                self._asked.discard(index)

    @staticmethod
    def _failed(done: Future[None]) -> None:
        exc = None if done.cancelled() else done.exception()
        if exc is not None:  # not one _open names: a bug, said loudly (the batch opens it)
            logger.error("opening the next shard ahead failed", exc_info=exc)
            note("open_ahead_failed", f"{type(exc).__name__}: {exc}")

    def close(self) -> None:
        """Stop the thread (an open in progress finishes); no shard opens ahead after."""
        with self._lock:
            pool, self._pool, self._closed = self._pool, None, True
        if pool is not None and pool[0] == os.getpid():
            executors.stop(pool[1])
