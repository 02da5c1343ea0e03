"""Worker pools that pull batch tasks from a queue; the consumer reorders by sequence number.

Workers never decide *what* to read: the consumer hands them ``(seq, ids)`` tasks computed
from the order, and results are handed back by ``seq``. Whichever worker finishes first,
the consumer yields batches in sequence order, so timing cannot change the order
(``in_order=False`` takes whichever pending batch is ready first instead, as torch does).

Each worker runs as a torch worker (``stoker.loader.workers.info``); a failure comes back as
a :class:`~stoker.loader.workers.failure.WorkerFailure` and is re-raised with its own type.
"""

from __future__ import annotations

import abc
import functools
import queue
import sys
import threading
import time
from typing import Any, Callable, Iterator, Sequence

from stoker.loader.errors import LoaderTimeoutError
from stoker.loader.workers.failure import WorkerFailure
from stoker.loader.workers.info import WorkerContext, user_code

__all__ = ["ThreadPool", "WorkerPool", "WorkerSetup", "batch_name", "late", "make_pool",
           "run_group"]

Task = Callable[[Any], Any]
INIT = "__init__"  # the results key of a failed worker_init_fn


class WorkerSetup:
    """What every worker of a pool starts with (torch's worker arguments)."""

    __slots__ = ("base_seed", "dataset", "group", "init", "mp_context", "num_workers",
                 "targeted")

    def __init__(self, num_workers: int, init: Callable[[int], None] | None = None,
                 base_seed: int = 0, dataset: Any = None, mp_context: Any = None,
                 targeted: bool = False, group: int = 1) -> None:
        self.num_workers, self.init, self.base_seed = num_workers, init, base_seed
        self.dataset, self.mp_context = dataset, mp_context
        # every task names its worker (an IterableDataset's iterator lives in one worker)
        self.targeted = targeted
        self.group = group  # batches per task at most (submit_group)

    def context(self, worker_id: int, mode: str) -> WorkerContext:
        return WorkerContext(worker_id, self.num_workers, self.base_seed, self.dataset, mode)


def batch_name(seq: Any) -> str:
    """How a message names the batch of sequence number ``(generation, step)``."""
    return f"batch {seq[1]}" if isinstance(seq, tuple) else str(seq)


def late(seq: Any, timeout: float | None) -> str:
    return (f"DataLoader timed out after {timeout} seconds: batch {seq} was not ready after "
            f"timeout={timeout}s; a worker is stuck or too slow. Raise timeout= or check the "
            "dataset/transform.")


def run_task(fn: Task, payload: Any, where: str, local: bool) -> Any:
    try:
        return fn(payload)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the consumer
        return WorkerFailure(exc, where, local)


def _call(fn: Callable[[], Any]) -> Any:
    return fn()


def run_group(fn: Any, seqs: list[Any], payloads: list[Any], where: str,
              local: bool, into: Any = None) -> Iterator[tuple[Any, Any]]:
    """``(seq, result)`` of each batch of a group task (``submit_group``), as soon as it is
    finished: the group is read by ``fn.many`` (stoker.loader.epoch_iter.BatchTask.many),
    into the buffer slot ``into`` when given, and a failure belongs to its own batch (all of
    them when the group read itself fails)."""
    calls = run_task(functools.partial(fn.many, into=into), payloads, where, local)
    if isinstance(calls, WorkerFailure):
        calls = [calls] * len(seqs)
    for seq, call in zip(seqs, calls):
        yield seq, call if isinstance(call, WorkerFailure) else run_task(_call, call, where,
                                                                         local)


def run_init(context: WorkerContext, init: Callable[[int], None] | None, where: str,
             local: bool) -> WorkerFailure | None:
    """Run ``worker_init_fn`` as torch does (after seeding); its failure, if any."""
    if init is None:
        return None
    try:
        if context.mode == "thread":
            with user_code() as call:
                call.seed(context.seed)
                init(context.id)
        else:
            init(context.id)
    except BaseException as exc:  # noqa: BLE001 - raised in the consumer at the next batch
        return WorkerFailure(exc, where, local)
    return None


def drop_stale(results: dict[Any, Any], seq: Any) -> None:
    """Drop results of earlier iterations: sequence numbers are ``(generation, step)``."""
    if isinstance(seq, tuple):
        for key in [k for k in results if isinstance(k, tuple) and k[0] < seq[0]]:
            del results[key]


def first_ready(results: dict[Any, Any], seqs: Sequence[Any]) -> Any:
    """The first of ``seqs`` whose result is in, or None."""
    return next((s for s in seqs if s in results), None)


class WorkerPool(abc.ABC):
    """Common interface: ``submit(seq, payload)``, ``get(seq, timeout)``, ``close()``."""

    num_workers: int

    @abc.abstractmethod
    def submit(self, seq: Any, payload: Any, worker: int | None = None) -> None:
        """Queue ``payload`` (the ids of one batch) under sequence number ``seq``; in a
        targeted pool, for ``worker``."""

    def get(self, seq: Any, timeout: float | None = None) -> Any:
        """Wait for the result of ``seq``; re-raise a worker's failure with its own type."""
        return self.get_any([seq], timeout)[1]

    @abc.abstractmethod
    def get_any(self, seqs: Sequence[Any], timeout: float | None = None) -> tuple[Any, Any]:
        """``(seq, result)`` of the first of ``seqs`` ready, preferring earlier ones."""

    @abc.abstractmethod
    def discard_pending(self) -> None:
        """Forget results and queued tasks of an abandoned iteration."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop the workers; idempotent."""

    def take_restarts(self) -> list[dict[str, Any]]:
        """Workers restarted since the last call (``worker``, ``exitcode``, ``batches``)."""
        return []

    def __del__(self) -> None:
        # at interpreter exit the daemon workers die with the process; modules may be gone
        if not sys.is_finalizing() and not getattr(self, "_closed", True):
            self.close()


_NAMES = {"thread": "worker", "reader": "reader"}  # a ThreadPool's mode -> its threads' name


def _thread_main(fn: Task, tasks: queue.Queue, results: dict, cond: threading.Condition,
                 context: WorkerContext, init: Callable[[int], None] | None) -> None:
    context.enter()
    where = f"{_NAMES[context.mode]} thread {context.id}"
    failure = run_init(context, init, where, local=True)
    if failure is not None:
        with cond:
            results[INIT] = failure
            cond.notify_all()
        return
    while True:
        item = tasks.get()
        if item is None:
            return
        seq, payload = item
        if isinstance(seq, list):  # a group (ThreadPool.submit_group): delivered one by one
            for one, out in run_group(fn, seq, payload, where, local=True):
                with cond:
                    results[one] = out
                    cond.notify_all()
            continue
        out = run_task(fn, payload, where, local=True)
        with cond:
            results[seq] = out
            cond.notify_all()


class ThreadPool(WorkerPool):
    """Threads sharing the process: the heavy work (Arrow, NumPy, Numba) releases the GIL."""

    def __init__(self, fn: Task, setup: WorkerSetup, mode: str = "thread") -> None:
        self.num_workers = setup.num_workers
        self._tasks: queue.Queue = queue.Queue()
        n = setup.num_workers
        self._queues = [queue.Queue() for _ in range(n)] if setup.targeted else [self._tasks] * n
        self._results: dict[Any, Any] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._threads = [
            threading.Thread(target=_thread_main, name=f"stoker-{_NAMES[mode]}-{i}", daemon=True,
                             args=(fn, self._queues[i], self._results, self._cond,
                                   setup.context(i, mode), setup.init))
            for i in range(setup.num_workers)
        ]
        for t in self._threads:
            t.start()

    def submit(self, seq: Any, payload: Any, worker: int | None = None) -> None:
        (self._tasks if worker is None else self._queues[worker]).put((seq, payload))

    def submit_group(self, seqs: list[Any], payloads: list[Any]) -> None:
        """Queue several batches as one task: one worker reads them together
        (``fn.many``, stoker.loader.epoch_iter.BatchTask.many) and hands each back under its
        own sequence number as soon as it is finished."""
        self._tasks.put((list(seqs), list(payloads)))

    def get_any(self, seqs: Sequence[Any], timeout: float | None = None) -> tuple[Any, Any]:
        deadline = None if not timeout else time.monotonic() + timeout
        with self._cond:
            drop_stale(self._results, seqs[0])
            while (seq := first_ready(self._results, seqs)) is None:
                if INIT in self._results:
                    self._results[INIT].reraise("its first batch (in worker_init_fn)")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise LoaderTimeoutError(late(seqs[0], timeout))
                self._cond.wait(timeout=left if left is not None else 1.0)
            out = self._results.pop(seq)
        if isinstance(out, WorkerFailure):
            out.reraise(batch_name(seq))
        return seq, out

    def discard_pending(self) -> None:
        for tasks in set(self._queues) | {self._tasks}:
            while True:
                try:
                    tasks.get_nowait()
                except queue.Empty:
                    break
        with self._cond:
            self._results.clear()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.discard_pending()
        for tasks in self._queues:
            tasks.put(None)
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=5)


def make_pool(fn: Task, mode: str, setup: WorkerSetup) -> WorkerPool:
    """A pool of ``setup.num_workers`` ``"thread"`` or ``"process"`` workers running ``fn``."""
    if mode == "thread":
        return ThreadPool(fn, setup)
    if mode == "process":
        from stoker.loader.workers.processes import ProcessPool

        return ProcessPool(fn, setup)
    raise ValueError(f"worker_mode={mode!r} is not supported; use 'thread' or 'process'")
