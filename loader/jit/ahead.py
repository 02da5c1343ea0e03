"""Work done ahead of need in one background thread per process, by key.

Readers of indexed Parquet decode (stoker.loader.read.indexed.row_groups, .natural) or check
(stoker.loader.read.indexed.source) the row group after the one just read while it is
served; a reader that reaches that group first waits for the job under way instead of doing
it twice. A forked process worker starts its own thread: its parent's is not in it, and a
job the parent had under way never finishes there.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Hashable

from stoker.loader.jit import executors, fork_gate

__all__ = ["Ahead"]


class Ahead:
    """Jobs by key in ``threads`` background threads named ``name`` (see the module
    docstring)."""

    def __init__(self, name: str, threads: int = 1) -> None:
        self._name, self._threads = name, threads
        self._lock = threading.Lock()
        self._pool: tuple[int, ThreadPoolExecutor] | None = None
        self._pending: dict[Hashable, Future[None]] = {}

    def start(self, key: Hashable, job: Callable[[], object]) -> None:
        """Run ``job`` in the background unless ``key``'s is under way; it runs inside a
        fork-gate unit (it may call pyarrow, which a fork must not split)."""
        with self._lock:
            if self._pool is None or self._pool[0] != os.getpid():  # none yet, or forked
                self._pool = (os.getpid(), ThreadPoolExecutor(self._threads,
                                                                  thread_name_prefix=self._name))
                self._pending = {}
            if key not in self._pending:
                self._pending[key] = self._pool[1].submit(self._run, key, job)

    def _run(self, key: Hashable, job: Callable[[], object]) -> None:
        try:
            with fork_gate.unit():
                job()
        finally:
            with self._lock:
                self._pending.pop(key, None)

    def wait(self, key: Hashable) -> None:
        """Wait for ``key``'s job if it is under way in this process; its error is raised
        here."""
        with self._lock:
            pending = self._pending.get(key) \
                if self._pool is not None and self._pool[0] == os.getpid() else None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Stop (a job under way finishes, queued ones are dropped)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None and pool[0] == os.getpid():
            executors.stop(pool[1])
