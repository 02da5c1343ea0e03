"""Natural order's next shard, opened before a batch reaches it.

In natural order a reader in this process (the reader thread of ``num_workers=0``, thread
workers) reads one shard after another, and the first batch of each shard opened it: mapping
its file, parsing its layout, mapping and checking its stored records, at every shard
boundary in the reader's own time (2 M W1 rows, a later natural run without workers: ~25 ms
of each shard's ~50 ms), and longer where the file comes from the disk. So when a
natural-order task is handed out, the shard after the one it ends in is opened by one
background thread (``stoker-next-shard``) while the current shard's batches are read (with
the shards of tasks handed out further ahead, where shards are small); the batch that
reaches it finds it open, or waits for that open (a shard opens once:
:class:`~stoker.loader.read.open_shards.OpenShards`). A shard opening early also starts its
records' build early on a node's first run.

Shuffled batches need every shard from the first batch on (which opens them all, several at
once: ``OpenShards.open_all``). Worker processes get their shards opened by the loader's
process (``ArrowSource.open_for_workers``): before they fork in the thread that forks them,
after it in this thread (:meth:`NextShard.open_soon`). A shard that cannot be opened ahead
is the counted fallback ``"open_ahead_failed"``: the batch that reaches it opens it again
and raises the error there, naming the shard.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Sequence

import numpy as np

from stoker.loader.errors import WorkerError
from stoker.loader.fallbacks import note
from stoker.loader.jit import executors, fork_gate
from stoker.loader.read.open_shards import OpenShards
from stoker.manifest import ShardIntegrityError

__all__ = ["NextShard"]

logger = logging.getLogger(__name__)

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
        self.open_soon([s for s in range(max(first, 0), min(following + 1,
                                                            len(self._starts) - 1))])

    def open_soon(self, shards: Sequence[int]) -> None:
        """Open ``shards`` (those not open yet) in the background thread, in order."""
        wanted = [s for s in shards if not self._shards.is_open(s)]
        if not wanted:
            return
        with self._lock:
            if self._closed:
                return
            wanted = [s for s in wanted if s not in self._asked]
            self._asked.update(wanted)
            if wanted and (self._pool is None or self._pool[0] != os.getpid()):
                self._pool = (os.getpid(),  # a forked child starts its own
                              ThreadPoolExecutor(1, thread_name_prefix="stoker-next-shard"))
            pool = self._pool[1] if wanted else None
        for index in wanted:
            pool.submit(self._open, index).add_done_callback(self._failed)  # type: ignore[union-attr]

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
