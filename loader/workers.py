"""Worker pools that pull batch tasks from a queue; the consumer reorders by sequence number.

Workers never decide *what* to read: the consumer hands them ``(seq, ids)`` tasks computed
from the order, and results are handed back by ``seq``. Whichever worker finishes first,
the consumer yields batches in sequence order, so timing cannot change the order.
"""

from __future__ import annotations

import abc
import collections
import logging
import os
import pickle
import queue
import threading
import time
import traceback
from typing import Any, Callable

import multiprocessing.connection as mp_connection
from multiprocessing.reduction import ForkingPickler

import torch.multiprocessing as tmp

from stoker.loader.errors import LoaderTimeoutError, WorkerError
from stoker.manifest import StokerError

__all__ = ["ProcessPool", "ThreadPool", "WorkerPool", "make_pool"]

log = logging.getLogger("stoker.loader")

Task = Callable[[Any], Any]
_POLL = 0.05
_PER_WORKER = 2  # batches handed to one worker process at a time
_MAX_TRIES = 3  # workers that may die on one batch before it is an error


class _Failure:
    """A worker's exception, carried as text (and as itself when it pickles).

    stoker's own typed errors (``ShardIntegrityError``, ``ManifestError``, cache errors)
    already name the shard and the fix, so the consumer re-raises them as they are, with a
    note naming the worker and the batch; anything else becomes a ``WorkerError``.
    """

    def __init__(self, worker: int, exc: BaseException) -> None:
        self.worker = worker
        self.kind = type(exc).__name__
        self.message = str(exc)
        self.trace = "".join(traceback.format_exception(exc))
        self.exc = exc if isinstance(exc, StokerError) and _pickles(exc) else None

    def raise_for(self, seq: Any) -> None:
        where = f"worker {self.worker} failed producing batch {seq}"
        if self.exc is not None and not isinstance(self.exc, WorkerError):
            self.exc.add_note(f"({where}; worker traceback:\n{self.trace})")
            raise self.exc
        detail = self.message if self.exc is not None else f"{self.kind}: {self.message}"
        err = WorkerError(f"{where}: {detail}\n--- worker traceback ---\n{self.trace}")
        raise err from self.exc


def _pickles(exc: BaseException) -> bool:
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - any failure means "send it as text"
        return False
    return True


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

    def take_restarts(self) -> list[dict[str, Any]]:
        """Workers restarted since the last call (``worker``, ``exitcode``, ``batches``)."""
        return []

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
                    raise LoaderTimeoutError(_late(seq, timeout))
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
            results.send(("__init__", _Failure(worker, exc)))
            return
    while True:
        try:
            item = tasks.recv()
        except (EOFError, OSError):  # the pool went away
            return
        if item is None:
            return
        seq, payload = item
        results.send((seq, _run_task(fn, worker, seq, payload)))


class _Proc:
    """One worker process with its own task pipe and result pipe.

    Private pipes (no locks shared between workers) mean a worker killed at any instant can
    corrupt nothing but its own pipes, which are thrown away with it.
    """

    __slots__ = ("index", "process", "results", "taken", "tasks")

    def __init__(self, ctx: Any, index: int, fn: Task,
                 init: Callable[[int], None] | None) -> None:
        task_r, self.tasks = ctx.Pipe(duplex=False)
        self.results, result_w = ctx.Pipe(duplex=False)
        self.index = index
        self.taken: dict[Any, Any] = {}  # seq -> payload sent to this worker, not yet answered
        self.process = ctx.Process(target=_process_main, name=f"stoker-worker-{index}",
                                   daemon=True, args=(fn, task_r, result_w, index, init))
        self.process.start()
        task_r.close()
        result_w.close()

    def stop(self, wait: float) -> None:
        try:
            self.tasks.send(None)
        except (OSError, ValueError):
            pass
        p = self.process
        p.join(timeout=wait)
        if p.is_alive():
            p.terminate()
            p.join(timeout=2)
        if p.is_alive():
            p.kill()
            p.join()
        for conn in (self.tasks, self.results):
            conn.close()
        p.close()  # its sentinel pipes now, not whenever the Process object is collected


class ProcessPool(WorkerPool):
    """Worker processes, for Python transforms that hold the GIL.

    Started with ``multiprocessing_context`` (default ``fork`` on Linux, as torch does), so
    the dataset need not be picklable; tensors travel through torch's shared memory. The
    consumer hands each worker at most ``_PER_WORKER`` batches at a time and remembers them:
    a worker that dies (killed, out of memory, a crash in native code) is started again and
    its batches are handed out again, so the sequence continues exactly. A batch whose
    worker dies ``_MAX_TRIES`` times is a :class:`WorkerError` naming it.
    """

    def __init__(self, fn: Task, num_workers: int,
                 worker_init_fn: Callable[[int], None] | None = None,
                 multiprocessing_context: str | None = None) -> None:
        self._ctx = tmp.get_context(multiprocessing_context
                                    or ("fork" if os.name == "posix" else "spawn"))
        self._fn, self._init = fn, worker_init_fn
        self.num_workers = num_workers
        self._backlog: collections.deque[tuple[Any, Any]] = collections.deque()
        self._results: dict[Any, Any] = {}
        self._tries: dict[Any, int] = {}
        self._restarts: list[dict[str, Any]] = []
        self.restarts = 0
        self._timeout: float | None = None
        self._closed = False
        self._workers = [_Proc(self._ctx, i, fn, worker_init_fn) for i in range(num_workers)]

    @property
    def pids(self) -> list[int]:
        return [] if self._closed else [w.process.pid for w in self._workers]

    def take_restarts(self) -> list[dict[str, Any]]:
        out, self._restarts = self._restarts, []
        return out

    def submit(self, seq: Any, payload: Any) -> None:
        self._backlog.append((seq, payload))
        self._dispatch()

    def _dispatch(self) -> None:
        for w in self._workers:
            while self._backlog and len(w.taken) < _PER_WORKER:
                seq, payload = self._backlog.popleft()
                w.taken[seq] = payload
                try:
                    w.tasks.send((seq, payload))
                except OSError:  # died meanwhile: _restart hands the batch out again
                    break

    def _receive(self, w: _Proc, current: Any, deadline: float | None) -> None:
        """Read one result of ``w`` (data or EOF is ready)."""
        try:
            key, value = _loads(w.results.recv_bytes(), deadline,
                                _late(current, self._timeout) + " (a worker stopped while "
                                "handing over a batch)")
        except LoaderTimeoutError:
            raise
        except Exception:  # noqa: BLE001 - EOF, or a dead sender's shared tensor: restart it
            if w.process.exitcode is None:
                w.process.kill()
                w.process.join()
            self._restart(w, current)
            return
        w.taken.pop(key, None)
        if key == "__init__":
            value.raise_for("(worker_init_fn)")
        if isinstance(key, tuple) and isinstance(current, tuple) and key[0] < current[0]:
            return  # an abandoned iteration's batch
        self._results[key] = value

    def _restart(self, w: _Proc, current: Any) -> None:
        code = w.process.exitcode
        lost = list(w.taken.items())
        for seq, _ in lost:
            self._tries[seq] = self._tries.get(seq, 0) + 1
            if self._tries[seq] >= _MAX_TRIES:
                raise WorkerError(f"worker process {w.index} (pid {w.process.pid}) died with "
                                  f"exit code {code} producing batch {seq}, the "
                                  f"{self._tries[seq]}th worker to die on it; the batch kills "
                                  "its worker (a crash in a transform or native code?). No "
                                  "batch was skipped: fix the cause and re-create the iterator.")
        log.warning("worker process %d (pid %s) died with exit code %s; restarting it and "
                    "handing out its %d batches again", w.index, w.process.pid, code, len(lost))
        pid = w.process.pid
        w.stop(wait=0)
        _remove_shm_of(pid)
        self._workers[w.index] = _Proc(self._ctx, w.index, self._fn, self._init)
        self._backlog.extendleft(reversed(lost))  # first in line, in order
        self.restarts += 1
        self._restarts.append({"worker": w.index, "exitcode": code,
                               "batches": [list(s) if isinstance(s, tuple) else s for s, _ in lost]})

    def _poll(self, current: Any, deadline: float | None) -> None:
        self._dispatch()
        by_conn = {w.results: w for w in self._workers}
        for conn in mp_connection.wait(list(by_conn), timeout=_POLL):
            self._receive(by_conn[conn], current, deadline)  # type: ignore[index]
        for w in list(self._workers):
            if w.process.exitcode is not None and self._workers[w.index] is w:
                while w.results.poll(0):  # what it sent before dying is still good
                    self._receive(w, current, deadline)
                    if self._workers[w.index] is not w:
                        break
                if self._workers[w.index] is w:
                    self._restart(w, current)

    def get(self, seq: Any, timeout: float | None = None) -> Any:
        deadline = None if not timeout else time.monotonic() + timeout
        self._timeout = timeout
        _drop_stale(self._results, seq)
        while seq not in self._results:
            self._poll(seq, deadline)
            if seq not in self._results and deadline is not None and time.monotonic() > deadline:
                raise LoaderTimeoutError(_late(seq, timeout))
        out = self._results.pop(seq)
        self._tries.pop(seq, None)
        if isinstance(out, _Failure):
            out.raise_for(seq)
        return out

    def discard_pending(self) -> None:
        self._backlog.clear()
        self._results.clear()
        self._tries.clear()
        for w in self._workers:  # still running: their late results are dropped as stale
            w.taken.clear()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.discard_pending()  # drops the shared-memory tensors of batches never consumed
        for w in self._workers:
            w.stop(wait=2)


def _remove_shm_of(pid: int | None) -> None:
    """Remove the shared-memory files a killed worker left in /dev/shm.

    torch names a tensor's segment ``torch_<pid>_...`` and unlinks it right after creating it;
    a worker killed in between leaves the file behind, and nobody else would remove it.
    """
    if pid is None or not os.path.isdir("/dev/shm"):
        return
    for name in os.listdir("/dev/shm"):
        if name.startswith(f"torch_{pid}_"):
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass


def _late(seq: Any, timeout: float | None) -> str:
    return (f"batch {seq} was not ready after timeout={timeout}s; a worker is stuck or too "
            "slow. Raise timeout= or check the dataset/transform.")


def _loads(raw: bytes, deadline: float | None, late: str) -> Any:
    """Unpickle a worker's result, within ``deadline`` when one is set.

    Rebuilding a shared-memory tensor asks the sending worker for its file descriptor; a
    stopped (SIGSTOP) or hung sender would block that forever, so with a ``timeout`` the
    rebuild runs in a helper thread the consumer stops waiting for.
    """
    if deadline is None:
        return ForkingPickler.loads(raw)
    box: list[Any] = []

    def load() -> None:
        try:
            box.append((True, ForkingPickler.loads(raw)))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer below
            box.append((False, exc))

    helper = threading.Thread(target=load, name="stoker-unpickle", daemon=True)
    helper.start()
    helper.join(max(0.0, deadline - time.monotonic()) + _POLL)
    if not box:
        raise LoaderTimeoutError(late)
    ok, value = box[0]
    if not ok:
        raise value
    return value


def make_pool(fn: Task, num_workers: int, mode: str,
              worker_init_fn: Callable[[int], None] | None = None,
              multiprocessing_context: str | None = None) -> WorkerPool:
    """A pool of ``num_workers`` ``"thread"`` or ``"process"`` workers running ``fn``."""
    if mode == "thread":
        return ThreadPool(fn, num_workers, worker_init_fn)
    if mode == "process":
        return ProcessPool(fn, num_workers, worker_init_fn, multiprocessing_context)
    raise ValueError(f"worker_mode={mode!r} is not supported; use 'thread' or 'process'")
