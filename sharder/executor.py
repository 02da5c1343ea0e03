"""Executors: run independent tasks and gather their small results.

The sharder needs only ``map(fn, tasks) -> iterator of results``; keeping that the whole
interface lets another engine (e.g. Dask) plug in without touching the sharder.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
from typing import Callable, Iterable, Iterator, Protocol, TypeVar

from stoker.sharder.errors import ShardOptionsError

__all__ = ["Executor", "LocalExecutor"]

T = TypeVar("T")
R = TypeVar("R")


class Executor(Protocol):
    """Runs ``fn`` on every task; yields each result once, in any order."""

    def map(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[R]:
        ...


class LocalExecutor:
    """In-process for ``workers=1``, else a process pool (forkserver) on this machine.

    A failing task cancels the tasks not yet started, waits for the running ones and
    re-raises the task's exception in the caller.
    """

    def __init__(self, workers: int = 1) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ShardOptionsError(f"workers={workers!r} must be a positive integer, e.g. 4.")
        self.workers = workers

    def map(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[R]:
        tasks = list(tasks)
        if self.workers == 1 or len(tasks) <= 1:
            yield from (fn(t) for t in tasks)
            return
        if "forkserver" in mp.get_all_start_methods():
            context = mp.get_context("forkserver")
            if fn.__module__ != "__main__":
                # Import the task's module (pyarrow with it) once in the fork server, not
                # in every worker; ignored when the server already runs.
                context.set_forkserver_preload([fn.__module__])
        else:
            context = mp.get_context("spawn")
        workers = min(self.workers, len(tasks))
        # Split the cores between the workers: N processes that each run a full-size Arrow
        # thread pool oversubscribe the machine.
        threads = max(1, (os.cpu_count() or 1) // workers)
        pool = cf.ProcessPoolExecutor(workers, mp_context=context, initializer=_set_threads,
                                      initargs=(threads,))
        try:
            futures = [pool.submit(fn, t) for t in tasks]
            for future in cf.as_completed(futures):
                yield future.result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def _set_threads(threads: int) -> None:
    """Worker initializer: size Arrow's CPU thread pool."""
    import pyarrow

    pyarrow.set_cpu_count(threads)
