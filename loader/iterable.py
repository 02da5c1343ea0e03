"""``IterableDataset`` with torch's semantics, outside stoker's order contract.

As in torch: each worker iterates its own copy of the dataset (``get_worker_info()`` tells it
which share to produce), fills batches of ``batch_size`` from its own iterator (a worker's
last batch may be short, or dropped with ``drop_last``), and the consumer takes batches from
the workers in turn, leaving out a worker once it is exhausted. stoker cannot know what the
dataset will yield, so there is no order to promise: the ledger marks the run
``"iterable": "order not guaranteed"`` and records each step's content digests instead of
sample ids.

Resume follows torchdata's Stateful protocol: a dataset with ``state_dict()`` /
``load_state_dict()`` has its state taken (in its worker) after every batch; the loader's
``state_dict()`` keeps each worker's state as of the last batch consumed, and
``load_state_dict()`` loads them into the workers' copies before they iterate again (same
``num_workers``). Without the protocol the state says why it cannot resume, and loading it
is a :class:`~stoker.loader.errors.StateError`.
"""

from __future__ import annotations

import itertools
import struct
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple

import numpy as np
import xxhash

from stoker.loader.ledger.digest import batch_digests
from stoker.loader.epoch_iter import EpochIterator, EpochPass, EpochRun
from stoker.loader.errors import StateError
from stoker.loader.workers.failure import add_note
from stoker.loader.workers.info import user_code

if TYPE_CHECKING:
    from stoker.loader.dataloader import DataLoader

__all__ = ["ITERABLE_STATE", "IterableEpoch", "IterableSource", "IterableTask", "iterable_state",
           "load_iterable_state"]

ITERABLE_STATE = "stoker-iterable/1"
_NO_IDS = np.zeros(0, dtype=np.int64)


def stateful(dataset: Any) -> bool:
    """The dataset follows torchdata's Stateful protocol."""
    return callable(getattr(dataset, "state_dict", None)) and \
        callable(getattr(dataset, "load_state_dict", None))


class IterableSource:
    """Stands where a stoker or map-style source stands: no samples to order."""

    kind = "iterable"

    def __init__(self, dataset: Any) -> None:
        cls = type(dataset)
        self.fingerprint = xxhash.xxh3_128_hexdigest(
            f"iterable-dataset:{cls.__module__}.{cls.__qualname__}".encode())
        self.shard_rows = np.zeros(0, dtype=np.int64)
        self.opened_shards: set[int] = set()

    def close(self) -> None:
        """Nothing to release."""


class Produced(NamedTuple):
    """A worker's answer: a batch (or ``None`` when its iterator is exhausted), its content
    digests, how many samples it holds, and the dataset's state after it (if Stateful)."""

    batch: Any
    content: list[int] | None
    count: int
    state: Any


class IterableTask:
    """Runs in a worker: the next batch of that worker's iterator over its dataset copy."""

    def __init__(self, dataset: Any, collate: Callable[[Any], Any], batch_size: int | None,
                 drop_last: bool, content: bool, thread: bool) -> None:
        self.dataset, self.collate = dataset, collate
        self.batch_size, self.drop_last = batch_size, drop_last
        self.content, self.thread = content, thread
        self._iters: dict[int, tuple[int, Any]] = {}  # worker -> (generation, iterator)

    def _iterator(self, gen: int, worker: int, start: Any) -> Any:
        held = self._iters.get(worker)
        if held is None or held[0] != gen:
            if start is not None:
                self.dataset.load_state_dict(start)
            held = (gen, iter(self.dataset))
            self._iters[worker] = held
        return held[1]

    def __call__(self, payload: tuple[int, int, int, Any, int]) -> Produced:
        gen, worker, j, start, seed = payload
        # thread workers share the process's generators: seed each call (restored after);
        # process workers and the main process keep torch's stream (see worker_info)
        with user_code(self.thread) as call:
            call.seed(seed)
            it = self._iterator(gen, worker, start)
            items = []
            for _ in range(self.batch_size or 1):
                try:
                    items.append(next(it))
                except StopIteration:
                    break
            if not items or (self.batch_size and self.drop_last and len(items) < self.batch_size):
                return Produced(None, None, 0, None)
            batch = self.collate(items if self.batch_size is not None else items[0])
            state = self.dataset.state_dict() if stateful(self.dataset) else None
        digests = batch_digests(batch, ["batch"]) if self.content else None
        return Produced(batch, digests, len(items), state)


class IterableEpoch(EpochPass):
    """One pass over an IterableDataset: batches from the workers in turn, as torch."""

    def __init__(self, run: EpochRun) -> None:
        EpochIterator._generation += 1  # one numbering: a pool drops older passes' results
        self._run, self._gen = run, EpochIterator._generation
        self._workers = run.workers
        saved = run.saved
        self._states: list[Any] = list(saved["workers"]) if saved else [None] * self._workers
        self._start = list(self._states) if saved else [None] * self._workers
        self._active = [w for w in range(self._workers)
                        if not saved or w not in saved["exhausted"]]
        first = saved["next_worker"] if saved else 0
        self._cycle = itertools.cycle(sorted(self._active, key=lambda w: (w < first, w)))
        self._sent = [0] * self._workers
        self._pending: list[tuple[int, int]] = []  # (seq, worker)
        self._seq = itertools.count()
        self._closed = False
        run.stats.begin()

    def _seed(self, worker: int, j: int) -> int:
        return xxhash.xxh3_64_intdigest(struct.pack("<qqqq", self._run.seed, self._run.epoch,
                                                    worker, j))

    def _payload(self, worker: int) -> tuple[int, int, int, Any, int]:
        j = self._sent[worker]
        self._sent[worker] += 1
        start, self._start[worker] = self._start[worker], None
        return self._gen, worker, j, start, self._seed(worker, j)

    def _fill(self) -> None:
        pool = self._run.pool
        while pool is not None and self._active and len(self._pending) < self._run.depth:
            worker = next(self._cycle)
            while worker not in self._active:
                worker = next(self._cycle)
            seq = (self._gen, next(self._seq))
            pool.submit(seq, self._payload(worker), worker=worker)
            self._pending.append((seq, worker))

    def _produce(self) -> tuple[int, Produced] | None:
        run = self._run
        while True:
            if run.pool is None:
                if not self._active:
                    return None
                try:
                    out = run.task(self._payload(0))
                except Exception as exc:
                    add_note(exc, "(stoker: in the main process, iterating the IterableDataset)")
                    raise
                if out.batch is None:
                    self._active.clear()
                    return None
                return 0, out
            self._fill()
            if not self._pending:
                return None
            seq, worker = self._pending.pop(0)
            out = run.pool.get(seq, run.timeout)
            if out.batch is not None:
                return worker, out
            if worker in self._active:  # exhausted: torch leaves the worker out from now on
                self._active.remove(worker)

    def __iter__(self) -> "IterableEpoch":
        return self

    def __next__(self) -> Any:
        run = self._run
        produced = None if self._closed else self._produce()
        if produced is None:
            if not self._closed and run.cursor.epoch == run.epoch:
                run.cursor.start_epoch(run.epoch + 1)
            self.close()
            raise StopIteration
        worker, out = produced
        self._states[worker] = out.state
        self._last = worker
        between = run.stats.record(out.count, 0.0)
        if run.ledger is not None:
            run.ledger.step(run.epoch, run.cursor.step, run.rank, _NO_IDS, 0.0, between,
                            out.content)
        run.cursor.step += 1
        return run.transfer(out.batch)

    def state(self) -> dict[str, Any]:
        """Where this pass is, for ``DataLoader.state_dict()``."""
        cursor = self._run.cursor
        active = sorted(self._active)
        last = getattr(self, "_last", None)
        after = [w for w in active if last is None or w > last] + \
            [w for w in active if last is not None and w <= last]
        return {"format": ITERABLE_STATE, "resumable": True, "epoch": cursor.epoch,
                "step": cursor.step, "num_workers": self._run.workers if self._run.pool else 0,
                "next_worker": after[0] if after else 0,
                "exhausted": [w for w in range(self._workers) if w not in self._active],
                "workers": list(self._states)}


def iterable_state(loader: DataLoader) -> dict[str, Any]:
    """``state_dict()`` of a loader over an IterableDataset."""
    if not stateful(loader.dataset):
        return {"format": ITERABLE_STATE, "resumable": False, "epoch": loader._cursor.epoch,
                "step": loader._cursor.step,
                "reason": f"{type(loader.dataset).__name__} does not implement state_dict() and "
                          "load_state_dict() (torchdata's Stateful protocol), so stoker cannot "
                          "resume it mid-epoch; implement them on the dataset."}
    active = loader._active
    if isinstance(active, IterableEpoch) and not active._closed:
        return active.state()
    return {"format": ITERABLE_STATE, "resumable": True, "epoch": loader._cursor.epoch, "step": 0,
            "num_workers": loader.num_workers, "next_worker": 0, "exhausted": [],
            "workers": [None] * max(loader.num_workers, 1)}


def load_iterable_state(loader: DataLoader, state: Mapping[str, Any]) -> None:
    """``load_state_dict()`` of a loader over an IterableDataset."""
    if not isinstance(state, Mapping) or state.get("format") != ITERABLE_STATE:
        raise StateError(f"not a stoker IterableDataset state (format="
                         f"{state.get('format') if isinstance(state, Mapping) else state!r}); "
                         "pass the dict returned by state_dict() of a loader over the same "
                         "IterableDataset.")
    if not state.get("resumable"):
        raise StateError(f"this state cannot be resumed: {state.get('reason')}")
    if state["num_workers"] != loader.num_workers:
        raise StateError(f"the state was saved with num_workers={state['num_workers']} and this "
                         f"loader has {loader.num_workers}: an IterableDataset's position lives "
                         "in each worker's copy. Resume with the saved num_workers.")
    if loader.num_workers and loader.worker_mode == "thread":
        raise StateError("thread workers share one dataset object, so per-worker states cannot "
                         "be loaded; resume with workers=WorkerOptions(mode='process') or num_workers=0.")
    if loader._active is not None:
        loader._active.close()
    loader._cursor.start_epoch(int(state["epoch"]))
    loader._cursor.step = int(state["step"])
    loader._iterable_state = dict(state) if state["step"] else None
