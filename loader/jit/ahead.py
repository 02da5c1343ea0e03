"""Work done ahead of need in background threads per process, by key.

Readers of indexed Parquet decode (stoker.loader.read.indexed.row_groups, .natural) or check
(stoker.loader.read.indexed.source) the row groups they will read next while others are
served; a reader that reaches such a group first waits for the job under way instead of
doing it twice, and with ``help=True`` runs queued jobs on its own thread meanwhile (a round
of staged rows needs every partition cursor's group at once: decoded by one background
thread while the round's thread waited, a node's first round over 2 M W1 rows of indexed
Parquet took 2.2 s, one core idle). A forked process worker starts its own threads: its
parent's are not in it, and a job the parent had under way never finishes there.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Hashable

from stoker.loader.jit import executors, fork_gate

__all__ = ["Ahead"]


class _Job:
    """One job: queued until a thread takes it; its ``future`` holds what it raised."""

    __slots__ = ("fn", "future")

    def __init__(self, fn: Callable[[], object]) -> None:
        self.fn = fn
        self.future: Future[None] = Future()


class Ahead:
    """Jobs by key in ``threads`` background threads named ``name`` (see the module
    docstring), taken in the order they were started."""

    def __init__(self, name: str, threads: int = 1) -> None:
        self._name, self._threads = name, threads
        self._lock = threading.Lock()
        self._pool: tuple[int, ThreadPoolExecutor] | None = None
        self._pending: dict[Hashable, _Job] = {}  # queued or running
        self._queued: OrderedDict[Hashable, _Job] = OrderedDict()  # not taken by a thread

    def start(self, key: Hashable, job: Callable[[], object]) -> None:
        """Run ``job`` in the background unless ``key``'s is under way; it runs inside a
        fork-gate unit (it may call pyarrow, which a fork must not split)."""
        with self._lock:
            if self._pool is None or self._pool[0] != os.getpid():  # none yet, or forked
                self._pool = (os.getpid(), ThreadPoolExecutor(self._threads,
                                                                  thread_name_prefix=self._name))
                self._pending, self._queued = {}, OrderedDict()
            if key in self._pending:
                return
            self._pending[key] = self._queued[key] = _Job(job)
            self._pool[1].submit(self._next)

    def _take(self, key: Hashable | None = None) -> tuple[Hashable, _Job] | None:
        """A queued job, now taken by the caller's thread: ``key``'s if it is queued, else
        the first queued (under the lock)."""
        if not self._queued:
            return None
        if key in self._queued:
            return key, self._queued.pop(key)
        return self._queued.popitem(last=False)

    def _next(self) -> None:
        with self._lock:
            taken = self._take()
        if taken is not None:  # none: a waiting thread ran it
            self._run(*taken)

    def _run(self, key: Hashable, job: _Job) -> None:
        job.future.set_running_or_notify_cancel()
        try:
            with fork_gate.unit():
                job.fn()
        except BaseException as exc:  # kept for the reader that waits for it
            self._finished(key)
            job.future.set_exception(exc)
        else:
            self._finished(key)
            job.future.set_result(None)

    def _finished(self, key: Hashable) -> None:
        """``key``'s job is no longer under way (before its waiters wake: one may start it
        again)."""
        with self._lock:
            self._pending.pop(key, None)

    def wait(self, key: Hashable, help: bool = False) -> None:
        """Wait for ``key``'s job if it is under way in this process; its error is raised
        here. ``help``: meanwhile run queued jobs on this thread (``key``'s first)."""
        with self._lock:
            if self._pool is None or self._pool[0] != os.getpid():
                return
            job = self._pending.get(key)
        if job is None:
            return
        while help and not job.future.done():
            with self._lock:
                taken = self._take(key)
            if taken is None:  # nothing queued: key's job runs in another thread
                break
            self._run(*taken)
        job.future.result()

    def close(self) -> None:
        """Stop (a job under way finishes, queued ones are dropped)."""
        with self._lock:
            pool, self._pool = self._pool, None
            dropped = list(self._queued.values())
            self._queued.clear()
            self._pending.clear()
        for job in dropped:  # a reader waiting for one gets CancelledError
            job.future.cancel()
        if pool is not None and pool[0] == os.getpid():
            executors.stop(pool[1])
