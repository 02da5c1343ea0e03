"""Worker pools that pull batch tasks from a queue; the consumer reorders by sequence number.

Workers never decide *what* to read: the consumer hands them ``(seq, ids)`` tasks computed
from the order, and results are handed back by ``seq``. Whichever worker finishes first,
the consumer yields batches in sequence order, so timing cannot change the order.
"""

from __future__ import annotations

import abc
import os
import queue
import threading
import time
import traceback
from typing import Any, Callable

import torch.multiprocessing as tmp

from stoker.loader.errors import LoaderTimeoutError, WorkerError

__all__ = ["ProcessPool", "ThreadPool", "WorkerPool", "make_pool"]

Task = Callable[[Any], Any]
_POLL = 0.05


class _Failure:
    """A worker's exception, carried as text so it always pickles."""

    def __init__(self, worker: int, exc: BaseException) -> None:
        self.worker = worker
        self.kind = type(exc).__name__
        self.message = str(exc)
        self.trace = "".join(traceback.format_exception(exc))
        self.exc = exc if isinstance(exc, WorkerError) else None

    def raise_for(self, seq: Any) -> None:
        detail = self.message if self.exc is not None else f"{self.kind}: {self.message}"
        err = WorkerError(f"worker {self.worker} failed producing batch {seq}: {detail}\n"
                          f"--- worker traceback ---\n{self.trace}")
        raise err from self.exc


def _run_task(fn: Task, worker: int, seq: Any, payload: Any) -> Any:
    try:
        return fn(payload)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the consumer
        return _Failure(worker, exc)


def _drop_stale(results: dict[Any, Any], seq: Any) -> None:
    """Drop results of earlier iterations: sequence numbers are ``(generation, step)``."""
    if isinstance(seq, tuple):
        for key in [k for k in results if isinstance(k, tuple) and k[0] < seq[0]]:
            del results[key]


class WorkerPool(abc.ABC):
    """Common interface: ``submit(seq, payload)``, ``get(seq, timeout)``, ``close()``."""

    num_workers: int

    @abc.abstractmethod
    def submit(self, seq: Any, payload: Any) -> None:
        """Queue ``payload`` (the ids of one batch) under sequence number ``seq``."""

    @abc.abstractmethod
    def get(self, seq: Any, timeout: float | None = None) -> Any:
        """Wait for the result of ``seq``; re-raise a worker's failure as WorkerError."""

    @abc.abstractmethod
    def discard_pending(self) -> None:
        """Forget results and queued tasks of an abandoned iteration."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop the workers; idempotent."""

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown may have torn down modules
            pass


def _thread_main(fn: Task, tasks: queue.Queue, results: dict, cond: threading.Condition,
                 worker: int, init: Callable[[int], None] | None) -> None:
    if init is not None:
        try:
            init(worker)
        except BaseException as exc:  # noqa: BLE001
            failure = _Failure(worker, exc)
            with cond:
                results["__init__"] = failure
                cond.notify_all()
            return
    while True:
        item = tasks.get()
        if item is None:
            return
        seq, payload = item
        out = _run_task(fn, worker, seq, payload)
        with cond:
            results[seq] = out
            cond.notify_all()


class ThreadPool(WorkerPool):
    """Threads sharing the process: the heavy work (Arrow, NumPy, Numba) releases the GIL."""

    def __init__(self, fn: Task, num_workers: int,
                 worker_init_fn: Callable[[int], None] | None = None) -> None:
        self.num_workers = num_workers
        self._tasks: queue.Queue = queue.Queue()
        self._results: dict[Any, Any] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._threads = [
            threading.Thread(target=_thread_main, name=f"stoker-worker-{i}", daemon=True,
                             args=(fn, self._tasks, self._results, self._cond, i, worker_init_fn))
            for i in range(num_workers)
        ]
        for t in self._threads:
            t.start()

    def submit(self, seq: Any, payload: Any) -> None:
        self._tasks.put((seq, payload))

    def get(self, seq: Any, timeout: float | None = None) -> Any:
        deadline = None if not timeout else time.monotonic() + timeout
        with self._cond:
            _drop_stale(self._results, seq)
            while seq not in self._results:
                if "__init__" in self._results:
                    self._results["__init__"].raise_for("(worker_init_fn)")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise LoaderTimeoutError(f"batch {seq} was not ready after timeout={timeout}s; "
                                             "a worker is stuck or too slow. Raise timeout= or "
                                             "check the dataset/transform.")
                self._cond.wait(timeout=left if left is not None else 1.0)
            out = self._results.pop(seq)
        if isinstance(out, _Failure):
            out.raise_for(seq)
        return out

    def discard_pending(self) -> None:
        while True:
            try:
                self._tasks.get_nowait()
            except queue.Empty:
                break
        with self._cond:
            self._results.clear()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.discard_pending()
        for _ in self._threads:
            self._tasks.put(None)
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=5)


def _process_main(fn: Task, tasks: Any, results: Any, worker: int,
                  init: Callable[[int], None] | None) -> None:
    if init is not None:
        try:
            init(worker)
        except BaseException as exc:  # noqa: BLE001
            results.put(("__init__", _Failure(worker, exc)))
            return
    while True:
        item = tasks.get()
        if item is None:
            return
        seq, payload = item
        results.put((seq, _run_task(fn, worker, seq, payload)))


class ProcessPool(WorkerPool):
    """Worker processes, for Python transforms that hold the GIL.

    Started with ``multiprocessing_context`` (default ``fork`` on Linux, as torch does), so
    the dataset need not be picklable; tensors travel through torch's shared memory.
    """

    def __init__(self, fn: Task, num_workers: int,
                 worker_init_fn: Callable[[int], None] | None = None,
                 multiprocessing_context: str | None = None) -> None:
        ctx = tmp.get_context(multiprocessing_context or ("fork" if os.name == "posix" else "spawn"))
        self.num_workers = num_workers
        self._tasks = ctx.Queue()
        self._out = ctx.Queue()
        self._results: dict[Any, Any] = {}
        self._closed = False
        self._procs = [ctx.Process(target=_process_main, name=f"stoker-worker-{i}", daemon=True,
                                   args=(fn, self._tasks, self._out, i, worker_init_fn))
                       for i in range(num_workers)]
        for p in self._procs:
            p.start()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]

    def submit(self, seq: Any, payload: Any) -> None:
        self._tasks.put((seq, payload))

    def _check_alive(self, seq: Any) -> None:
        for i, p in enumerate(self._procs):
            if p.exitcode is not None:
                raise WorkerError(f"worker process {i} (pid {p.pid}) died with exit code "
                                  f"{p.exitcode} while the loader waited for batch {seq}; "
                                  "no batch was lost or skipped. Re-create the iterator to "
                                  "continue from the last yielded batch.")

    def get(self, seq: Any, timeout: float | None = None) -> Any:
        deadline = None if not timeout else time.monotonic() + timeout
        _drop_stale(self._results, seq)
        while seq not in self._results:
            try:
                key, value = self._out.get(timeout=_POLL)
                if isinstance(key, tuple) and isinstance(seq, tuple) and key[0] < seq[0]:
                    continue
                self._results[key] = value
                if key == "__init__":
                    value.raise_for("(worker_init_fn)")
                continue
            except queue.Empty:
                pass
            self._check_alive(seq)
            if deadline is not None and time.monotonic() > deadline:
                raise LoaderTimeoutError(f"batch {seq} was not ready after timeout={timeout}s; "
                                         "a worker is stuck or too slow. Raise timeout= or "
                                         "check the dataset/transform.")
        out = self._results.pop(seq)
        if isinstance(out, _Failure):
            out.raise_for(seq)
        return out

    def discard_pending(self) -> None:
        while True:
            try:
                self._tasks.get_nowait()
            except queue.Empty:
                break
        self._results.clear()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.discard_pending()
            for _ in self._procs:
                self._tasks.put(None)
        except (OSError, ValueError):
            pass
        for p in self._procs:
            p.join(timeout=2)
            if p.is_alive():
                p.terminate()
                p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join()
        for q in (self._tasks, self._out):
            q.cancel_join_thread()
            q.close()


def make_pool(fn: Task, num_workers: int, mode: str,
              worker_init_fn: Callable[[int], None] | None = None,
              multiprocessing_context: str | None = None) -> WorkerPool:
    """A pool of ``num_workers`` ``"thread"`` or ``"process"`` workers running ``fn``."""
    if mode == "thread":
        return ThreadPool(fn, num_workers, worker_init_fn)
    if mode == "process":
        return ProcessPool(fn, num_workers, worker_init_fn, multiprocessing_context)
    raise ValueError(f"worker_mode={mode!r} is not supported; use 'thread' or 'process'")
