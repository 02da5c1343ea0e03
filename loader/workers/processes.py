"""Worker processes, for Python code that holds the GIL (split from ``workers.py``).

Each worker is a torch worker process (``stoker.loader.workers.info``): its own copy of the
dataset, one intra-op thread, torch's seeding, ``get_worker_info()``. Work is handed out by
the consumer and results come back by sequence number, as for threads; a stoker dataset's
batches go out in groups (``submit_group``), gathered straight into a slot of the worker's
shared-memory ring, and come back as one message per group (stoker.loader.workers.transport:
``Ring.borrow``, ``Ring.put_group``). Workers are forked
after the consumer's copy of the dataset opened the shards of their first tasks
(stoker.loader.dataloader), so they inherit those maps instead of opening them again.
"""

from __future__ import annotations

import collections
import importlib
import logging
import os
import pickle
import signal
import threading
import time
from typing import Any, Sequence

import multiprocessing.connection as mp_connection
from multiprocessing.reduction import ForkingPickler

import torch.multiprocessing as tmp

from stoker.loader.errors import LoaderTimeoutError, WorkerError
from stoker.loader.fallbacks import note
from stoker.loader.jit import fork_gate
from stoker.loader.workers.failure import WorkerFailure
from stoker.loader.workers.info import WorkerContext
from stoker.loader.workers.transport import IN_FLIGHT, LEASES, Answers, Ring, dumps
from stoker.loader.workers.pool import (INIT, Task, WorkerPool, WorkerSetup, batch_name,
                                        drop_stale, first_ready, late, run_group, run_init,
                                        run_task)

__all__ = ["ProcessPool", "quiet_for_forks"]

log = logging.getLogger("stoker.loader")

_POLL = 0.05
_MAX_TRIES = 3  # workers that may die on one batch before it is an error
_WATCH = 5.0  # seconds between a waiting worker's checks that its consumer is alive
_FORK_WAIT = 60.0  # longest a fork waits for stoker's background threads (fork_gate)
_TASK_SLOT = 1 << 20  # bytes of a task ring slot: a group's ids (8,192 int64) with room


def _process_main(fn: Task, tasks: Any, results: Any, context: WorkerContext,
                  init: Any, ring: Ring | None = None, task_ring: Ring | None = None) -> None:
    context.enter()
    where = f"worker process {context.id} (pid {os.getpid()})"
    failure = run_init(context, init, where, local=False)
    if failure is not None:
        results.send((INIT, failure))
        return
    parent = os.getppid()
    while True:
        try:
            if not tasks.poll(_WATCH):
                if os.getppid() != parent:  # the consumer died (torch's ManagerWatchdog)
                    return
                continue
            raw = tasks.recv_bytes()
        except (EOFError, OSError):  # the pool went away
            return
        item = ForkingPickler.loads(raw) if task_ring is None else task_ring.loads(raw)
        if item is None:
            return
        seq, payload = item
        if not isinstance(seq, list):
            results.send_bytes(_put(ring, (seq, run_task(fn, payload, where, local=False))))
            continue
        # a group is gathered into a slot of the ring and its plain answers go over as one
        # message; the slot is given back unless that message refers to it
        region = None if ring is None else ring.borrow()
        try:
            plain: list[tuple[Any, Any]] = []
            for one in run_group(fn, seq, payload, where, local=False, into=region):
                arrays = None if region is None else region.ring.plain(one)
                if arrays is not None:
                    plain.append((one, arrays))
                    continue
                for earlier, _ in plain:  # in order
                    results.send_bytes(_put(ring, earlier))
                plain = []
                results.send_bytes(_put(ring, one))
            raw = None if region is None or not plain else region.ring.put_group(plain, region)
            if raw is not None:
                region = None  # the consumer's now
            for message in [raw] if raw is not None else [_put(ring, o) for o, _ in plain]:
                results.send_bytes(message)
        finally:
            if region is not None:
                region.ring.give_back(region)


def _put(ring: Ring | None, one: Any) -> bytes:
    return dumps(one) if ring is None else ring.put(one)


def quiet_for_forks() -> Any:
    """The fork gate held for worker forks (stoker.loader.jit.fork_gate.quiet): waits at
    most ``_FORK_WAIT`` s for background work in progress; yields whether none was left."""
    return fork_gate.quiet(_FORK_WAIT)


# Imported by stoker's background threads on first use (NumPy imports these lazily).
_LAZY_IMPORTS = ("numpy.ma", "numpy.random")


def _settle_imports() -> None:
    """Before a fork: a child forked while another thread of this process holds a module's
    import lock waits on that lock forever (seen: ``np.unique`` importing ``numpy.ma`` in a
    warm-up thread). Importing those modules here waits for an import in progress and leaves
    none for the threads to start. Numba is not imported here: its import is a fork-gate
    unit (stoker.loader.jit.kernel.materialize), and a worker that runs the kernels compiled
    ahead of time never needs it."""
    for name in _LAZY_IMPORTS:
        importlib.import_module(name)


class _Proc:
    """One worker process with its own task pipe and result pipe.

    Private pipes (no locks shared between workers) mean a worker killed at any instant can
    corrupt nothing but its own pipes, which are thrown away with it.
    """

    __slots__ = ("index", "process", "results", "ring", "task_ring", "taken", "tasks")

    def __init__(self, ctx: Any, index: int, fn: Task, setup: WorkerSetup, limit: int) -> None:
        task_r, self.tasks = ctx.Pipe(duplex=False)
        self.results, result_w = ctx.Pipe(duplex=False)
        fork = ctx.get_start_method() == "fork"
        # made before the fork (the child shares them); a slot more than the batches it holds,
        # and the slots lent to batches the caller holds. Tasks too: a group's ids (up to
        # 64 KB) written into a pipe filled it, and the consumer's send blocked until the busy
        # worker read them.
        self.ring = Ring(slots=limit + 1, leases=LEASES) if fork else None
        self.task_ring = Ring(slots=limit + 1, slot_bytes=_TASK_SLOT) if fork else None
        self.index = index
        self.taken: dict[Any, Any] = {}  # seq -> payload sent to this worker, not yet answered
        self.process = ctx.Process(target=_process_main, name=f"stoker-worker-{index}",
                                   daemon=True, args=(fn, task_r, result_w,
                                                      setup.context(index, "process"),
                                                      setup.init, self.ring, self.task_ring))
        if fork:
            _settle_imports()
            with quiet_for_forks() as calm:
                self.process.start()
            if not calm:
                note("fork_busy", f"worker process {index}: a unit still ran after "
                                  f"{_FORK_WAIT:.0f} s")
        else:
            self.process.start()
        task_r.close()
        result_w.close()

    def ask_to_stop(self) -> None:
        """Tell the worker to exit once its current task is done (then :meth:`stop`)."""
        try:
            self.tasks.send_bytes(dumps(None))
        except (OSError, ValueError):
            pass

    def stop(self, wait: float) -> None:
        """Wait up to ``wait`` s for the worker to exit (asked to, or dead), then end it;
        close its pipes and rings."""
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
        for ring in (self.ring, self.task_ring):
            if ring is not None:
                ring.close()


def _context(mp_context: Any) -> Any:
    """A multiprocessing context from ``multiprocessing_context`` (a start method or a
    context object, validated by the DataLoader as torch does); ``fork`` on POSIX by default."""
    if mp_context is None:
        return tmp.get_context("fork" if os.name == "posix" else "spawn")
    return tmp.get_context(mp_context) if isinstance(mp_context, str) else mp_context


def _death(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        return f"was killed by signal {-code} ({name})"
    return f"exited unexpectedly with exit code {code}"


class ProcessPool(WorkerPool):
    """Worker processes, for Python transforms and datasets that hold the GIL.

    Started with ``multiprocessing_context`` (default ``fork`` on Linux, as torch does), so
    the dataset need not be picklable; tensors travel through torch's shared memory. The
    consumer hands each worker at most ``IN_FLIGHT`` tasks (of up to ``setup.group`` batches:
    :meth:`submit_group`) at a time and remembers their batches:
    a worker that dies (killed, out of memory, a crash in native code) is started again and
    its batches are handed out again, so the sequence continues exactly. A batch whose
    worker dies ``_MAX_TRIES`` times is a :class:`WorkerError` (a ``RuntimeError``) naming
    the batch, the worker's pid and the signal.
    """

    def __init__(self, fn: Task, setup: WorkerSetup) -> None:
        self._ctx = _context(setup.mp_context)
        self._fn, self._setup = fn, setup
        self.num_workers = setup.num_workers
        self._backlog: collections.deque[tuple[Any, Any]] = collections.deque()
        self._targets: dict[Any, int] = {}  # seq -> its worker, in a targeted pool
        self._results: dict[Any, Any] = {}
        self._tries: dict[Any, int] = {}
        self._restarts: list[dict[str, Any]] = []
        self.restarts = 0
        self.grouped = 0  # batches handed out in groups
        self._generation: int | None = None  # of the iteration being read (seq[0])
        self._checked = 0.0  # when the workers' exit codes were last read
        self._timeout: float | None = None
        self._closed = False
        self._limit = IN_FLIGHT * max(1, setup.group)  # batches handed to one worker at once
        self._workers = [self._start(i) for i in range(setup.num_workers)]

    def _start(self, index: int) -> _Proc:
        return _Proc(self._ctx, index, self._fn, self._setup, self._limit)

    @property
    def pids(self) -> list[int]:
        return [] if self._closed else [w.process.pid for w in self._workers]

    def take_restarts(self) -> list[dict[str, Any]]:
        out, self._restarts = self._restarts, []
        return out

    def submit(self, seq: Any, payload: Any, worker: int | None = None) -> None:
        self._backlog.append((seq, payload))
        if worker is not None:
            self._targets[seq] = worker
        self._dispatch()

    def submit_group(self, seqs: list[Any], payloads: list[Any]) -> None:
        """Queue several batches as one task (at most ``setup.group``): one worker reads
        them together (``fn.many``, stoker.loader.epoch_iter.BatchTask.many) and hands each
        back under its own sequence number as soon as it is finished. A worker that dies
        meanwhile has its unanswered batches handed out again one by one."""
        size = max(1, self._setup.group)
        self.grouped += len(seqs)
        for at in range(0, len(seqs), size):
            self._backlog.append((list(seqs[at:at + size]), list(payloads[at:at + size])))
        self._dispatch()

    def _stale(self, seq: Any) -> bool:
        """Whether ``seq`` belongs to an iteration before the one being read."""
        return isinstance(seq, tuple) and self._generation is not None \
            and seq[0] < self._generation

    def _fits(self, w: _Proc, seq: Any) -> bool:
        return len(w.taken) + (len(seq) if isinstance(seq, list) else 1) <= self._limit

    def _send(self, w: _Proc, seq: Any, payload: Any) -> bool:
        w.taken.update(zip(seq, payload) if isinstance(seq, list) else [(seq, payload)])
        try:
            item = (seq, payload)
            w.tasks.send_bytes(dumps(item) if w.task_ring is None else w.task_ring.put(item))
        except OSError:  # died meanwhile: _restart hands the batch out again (or raises)
            return False
        return True

    def _dispatch(self) -> None:
        if self._setup.targeted:  # each task to its worker, each worker's tasks in order
            for _ in range(len(self._backlog)):
                seq, payload = self._backlog.popleft()
                w = self._workers[self._targets[seq]]
                if not self._fits(w, seq):
                    self._backlog.append((seq, payload))
                else:
                    self._send(w, seq, payload)
            return
        for w in self._workers:
            while self._backlog and self._fits(w, self._backlog[0][0]):
                if not self._send(w, *self._backlog.popleft()):
                    break

    def _receive(self, w: _Proc, current: Any, deadline: float | None) -> None:
        """Read one result of ``w`` (data or EOF is ready)."""
        try:
            got = _loads(w.results.recv_bytes(), w.ring, deadline,
                         late(current, self._timeout) + " (a worker stopped while handing "
                         "over a batch)")
        except LoaderTimeoutError:
            raise
        except (EOFError, OSError, RuntimeError, pickle.UnpicklingError):
            # EOF, or a dead sender's shared tensor (torch: RuntimeError): restart it
            if w.process.exitcode is None:
                w.process.kill()
                w.process.join()
            self._restart(w)
            return
        for key, value in got if isinstance(got, Answers) else [got]:
            w.taken.pop(key, None)
            if key == INIT:
                value.reraise("its first batch (in worker_init_fn)")
            if isinstance(key, tuple) and isinstance(current, tuple) and key[0] < current[0]:
                continue  # an abandoned iteration's batch
            self._results[key] = value

    def _restart(self, w: _Proc) -> None:
        code, pid = w.process.exitcode, w.process.pid
        lost = [(seq, p) for seq, p in w.taken.items() if not self._stale(seq)]
        if self._setup.targeted:  # its iterator and position died with it
            raise WorkerError(f"DataLoader worker process {w.index} (pid {pid}) {_death(code)}; "
                              "its IterableDataset iterator died with it, so the epoch cannot "
                              "continue exactly. Fix the cause and re-create the iterator.")
        for seq, _ in lost:
            self._tries[seq] = self._tries.get(seq, 0) + 1
            if self._tries[seq] >= _MAX_TRIES:
                raise WorkerError(f"DataLoader worker process {w.index} (pid {pid}) "
                                  f"{_death(code)} producing {batch_name(seq)}; "
                                  f"{self._tries[seq]} workers have died on it, so the batch kills "
                                  "its worker (a crash in a transform or native code?). No "
                                  "batch was skipped: fix the cause and re-create the iterator.")
        log.warning("DataLoader worker process %d (pid %s) %s; restarting it and handing out "
                    "its %d batches again", w.index, pid, _death(code), len(lost))
        w.stop(wait=0)
        _remove_shm_of(pid)
        self._workers[w.index] = self._start(w.index)
        self._backlog.extendleft(reversed(lost))  # first in line, in order
        self.restarts += 1
        self._restarts.append({"worker": w.index, "exitcode": code,
                               "batches": [list(s) if isinstance(s, tuple) else s for s, _ in lost]})

    def _poll(self, seqs: Sequence[Any], deadline: float | None) -> None:
        """Hand out work, read results, restart dead workers. Waiting for one batch, only
        its worker's results are read (they arrive in its tasks' order), so each batch is
        taken out of the worker's ring just before it is yielded rather than as soon as it
        arrived (measured while batches were copied out: 2 M W1 rows, shuffled, 2 process
        workers, later epochs, 4 interleaved runs each: 3.85 against 3.5 M rows/s)."""
        self._dispatch()
        current = seqs[0]
        self._generation = current[0] if isinstance(current, tuple) else None
        read = [w for w in self._workers if current in w.taken] if len(seqs) == 1 else []
        if read:  # and the results of an abandoned iteration, which hold ring slots
            read += [w for w in self._workers if w is not read[0]
                     and any(self._stale(seq) for seq in w.taken)]
        by_conn = {w.results: w for w in read or self._workers}
        for conn in mp_connection.wait(list(by_conn), timeout=_POLL):
            self._receive(by_conn[conn], current, deadline)  # type: ignore[index]
        # a dead worker's pipe reads EOF once what it sent is read, so waiting for its batch
        # finds it; the exit codes (a waitpid each) are for the others, every _POLL seconds
        now = time.monotonic()
        if now - self._checked < _POLL:
            return
        self._checked = now
        for w in list(self._workers):
            if w.process.exitcode is not None and self._workers[w.index] is w:
                while w.results.poll(0):  # what it sent before dying is still good
                    self._receive(w, current, deadline)
                    if self._workers[w.index] is not w:
                        break
                if self._workers[w.index] is w:
                    self._restart(w)

    def get_any(self, seqs: Sequence[Any], timeout: float | None = None) -> tuple[Any, Any]:
        deadline = None if not timeout else time.monotonic() + timeout
        self._timeout = timeout
        drop_stale(self._results, seqs[0])
        while (seq := first_ready(self._results, seqs)) is None:
            self._poll(seqs, deadline)
            if first_ready(self._results, seqs) is None and deadline is not None \
                    and time.monotonic() > deadline:
                raise LoaderTimeoutError(late(seqs[0], timeout))
        out = self._results.pop(seq)
        self._tries.pop(seq, None)
        if isinstance(out, WorkerFailure):
            out.reraise(batch_name(seq))
        return seq, out

    def discard_pending(self) -> None:
        # the workers' tasks in flight stay in their ``taken`` until their results are read
        # (and dropped as stale): each holds a slot of the worker's ring until then, and a
        # worker handed new tasks meanwhile overwrote unread slots (RingError)
        self._backlog.clear()
        self._targets.clear()
        self._results.clear()
        self._tries.clear()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.discard_pending()  # drops the shared-memory tensors of batches never consumed
        for w in self._workers:  # all told first: they exit (unmap, tear down) together
            w.ask_to_stop()
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


def _loads(raw: bytes, ring: Ring | None, deadline: float | None, message: str) -> Any:
    """Unpickle a worker's result, within ``deadline`` when one is set.

    Rebuilding a shared-memory tensor asks the sending worker for its file descriptor; a
    stopped (SIGSTOP) or hung sender would block that forever, so with a ``timeout`` the
    rebuild runs in a helper thread the consumer stops waiting for.
    """
    loads = ForkingPickler.loads if ring is None else ring.loads
    if deadline is None:
        return loads(raw)
    box: list[Any] = []

    def load() -> None:
        try:
            box.append((True, loads(raw)))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer below
            box.append((False, exc))

    helper = threading.Thread(target=load, name="stoker-unpickle", daemon=True)
    helper.start()
    helper.join(max(0.0, deadline - time.monotonic()) + _POLL)
    if not box:
        raise LoaderTimeoutError(message)
    ok, value = box[0]
    if not ok:
        raise value
    return value
