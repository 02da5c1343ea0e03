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
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa

from stoker.loader.errors import WorkerError
from stoker.loader.fastpath.advise import (advise_list_offsets, advise_open, advise_random,
                                           advise_whole)
from stoker.loader.fastpath.ipc_meta import FileBatches, batch_rows
from stoker.loader.fastpath.plan import NotZeroCopy, ShardData, _kind
from stoker.loader.jit import fork_gate
from stoker.manifest import Manifest, ShardIntegrityError

__all__ = ["OPENERS", "OpenShards", "ShardOpener"]

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
            entry = self._open.pop(index, None)
            if entry is None:
                return
            self.data.pop(index, None)
            self._on_dropped(index)
            self._lock.notify_all()
        entry[1].__exit__(None, None, None)

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
        evicted, (_, handle) = self._open.popitem(last=False)
        self.data.pop(evicted, None)
        self._on_dropped(evicted)
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
