"""One pass over an epoch: tasks to workers in order, batches back in sequence order.

The DataLoader owns configuration and position; it hands each pass an :class:`EpochRun` of
explicit values (the steps and their ids, the workers, the ledger, its :class:`Cursor`). An
:class:`EpochIterator` owns one iteration: the pending tasks, the ledger records of the steps
it yields, the cursor's moves.
"""

from __future__ import annotations

import functools
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, NamedTuple

import numpy as np

from stoker.loader.workers.failure import add_note
from stoker.loader.ledger.digest import batch_digests
from stoker.loader.fallbacks import Noted, collecting, drain, note
from stoker.loader.workers.sample_rng import batch_seed
from stoker.loader.state import Cursor
from stoker.loader.workers.info import user_code
from stoker.manifest import StokerError

__all__ = ["BatchTask", "CacheEvents", "Delivered", "EpochIterator", "EpochPass", "EpochRun",
           "cache_clock"]


# (ledger event kind, CacheStats counter)
_CACHE_EVENTS = (("retry", "retries"), ("restart", "restarts"), ("quarantine", "quarantines"),
                 ("repair", "repaired"))


class Delivered(NamedTuple):
    """A worker's answer: the batch, its content digests (one per ledger content column, or
    ``None`` without a ledger) and the fallbacks it took (stoker.loader.fallbacks)."""

    batch: Any
    content: list[int] | None
    fallbacks: Noted


class BatchTask:
    """What a worker runs for one batch. Holds no reference to the DataLoader, so worker
    threads never keep an abandoned loader alive.

    The user's batch-level code (``collate_fn`` of a stoker dataset, ``transform``) runs as
    user code (``stoker.loader.workers.info.user_code``), seeded from the batch's ids.
    ``content``: the columns to digest (stoker.loader.ledger.digest), on the batch as the
    source delivered it, before ``collate`` and ``transform``; ``None``: no digests.
    """

    def __init__(self, source: Any, collate: Callable[[Any], Any] | None,
                 transform: Callable[[Any], Any] | None, seeding: bool = True,
                 content: list[str] | None = None) -> None:
        self.source, self.collate, self.transform = source, collate, transform
        self.seeding = seeding
        self.content = content

    def __call__(self, payload: tuple[Any, int, int]) -> Delivered:
        ids, epoch, seed = payload  # epoch and seed key per-sample augmentation and RNG
        with collecting() as noted:
            batch, digests = self.fetch(ids, epoch, seed)
        return Delivered(self.finish(batch, ids, epoch, seed), digests, noted)

    def many(self, payloads: list[tuple[Any, int, int]], into: Any = None
             ) -> list[Callable[[], Delivered]]:
        """One delivery per payload, as calls that finish it: the batches' fetch runs here,
        as one group where the source can (``fetch_group``: one record gather for all of
        them, into the buffer slot ``into`` when given); what is left of each (``collate``,
        ``transform``; or its whole fetch, when the group cannot be read at once) runs in
        its call, so a failure belongs to its own batch. Only for sources with
        ``group_rows`` (stoker.loader.dataloader groups no other)."""
        _, epoch, seed = payloads[0]  # one pass: one epoch and seed
        digest = None if self.content is None else self._digests
        try:
            with collecting() as noted:
                got = self.source.fetch_group([p[0] for p in payloads], epoch, seed, digest,
                                              into)
        except (StokerError, OSError) as exc:  # each batch is read again on its own
            note("group_retried", f"batches of samples {payloads[0][0][:8].tolist()}...: "
                                  f"{type(exc).__name__}: {exc}")
            got = None
        if got is None:
            return [functools.partial(self, p) for p in payloads]
        return [functools.partial(self._finished, batch, digests, noted if i == 0 else {},
                                  payloads[i])
                for i, (batch, digests) in enumerate(got)]

    def _finished(self, batch: Any, digests: list[int] | None, noted: Noted,
                  payload: tuple[Any, int, int]) -> Delivered:
        ids, epoch, seed = payload
        return Delivered(self.finish(batch, ids, epoch, seed), digests, noted)

    def fetch(self, ids: Any, epoch: int, seed: int) -> tuple[Any, list[int] | None]:
        """The source's batch and its content digests (``None`` without ``content``); a
        source with ``fetch_digested`` (stoker.loader.read.arrow) has them computed on its
        arrays as soon as they are written (same digests, less time)."""
        if self.content is None:
            return self.source.fetch(ids, epoch, seed), None
        fetch_digested = getattr(self.source, "fetch_digested", None)
        if fetch_digested is not None:
            return fetch_digested(ids, epoch, seed, self._digests)  # type: ignore[no-any-return]
        batch = self.source.fetch(ids, epoch, seed)
        return batch, batch_digests(batch, self.content)

    def _digests(self, batch: Any, arrays: Mapping[str, np.ndarray]) -> list[int]:
        return batch_digests(batch, self.content, arrays)  # type: ignore[arg-type]

    def finish(self, batch: Any, ids: Any, epoch: int, seed: int) -> Any:
        """The user's ``collate`` and ``transform`` on a delivered batch (also what the data
        service's client runs on a batch it received, stoker.loader.service.pool)."""
        if self.collate is None and self.transform is None:
            return batch
        with user_code(self.seeding) as call:
            call.seed(batch_seed(seed, epoch, ids))
            if self.collate is not None:
                batch = self.collate(batch)
            if self.transform is not None:
                batch = self.transform(batch)
        return batch


@dataclass(frozen=True)
class EpochRun:
    """What one pass over an epoch uses, handed over by the DataLoader as values: a pass
    never reads the loader's state, it moves ``cursor`` and calls ``end`` when it stops.

    Attributes:
        epoch, seed, rank: the pass's epoch, the loader's seed, this process's rank.
        cursor: the loader's position, advanced as batches are yielded.
        task: computes one batch in this process (``pool is None``).
        pool, depth: the workers (``None``: none) and how many batches to keep queued.
        group: batches per worker task (``pool.submit_group``; 1: one task per batch).
        in_order: yield in step order (else as batches are ready).
        timeout: seconds to wait for a worker's batch (``None``: forever).
        transfer: moves a batch to its device (pinned copies).
        stats, fallbacks, ledger: where yielded batches are counted and recorded.
        end: called once when the pass stops (hands the workers back, flushes the ledger).
        is_current: whether a pass is still the loader's active one (a stale pass that
            finishes does not move the loader to the next epoch).
        steps, skip: the steps to yield (from the cursor on) and those yielded before a
            resume (``in_order=False``).
        ids: stoker's order: a step's sample ids; else ``sampler``: the sampler's items from
            ``steps.start`` on, lists of indices when ``batched``.
        cache_clock, cache_events: move the node cache's future to a step; write what the
            cache did to the ledger (``None``: no cache).
        workers, saved: an IterableDataset's pass: worker slots and a loaded state.
        open_ahead: called with the tasks' ids as they are handed out: before a worker
            process gets them (the source opens their shards here, to build the records the
            workers map), or before this process's readers do (natural order's next shard
            opens ahead).
    """

    epoch: int
    seed: int
    rank: int
    cursor: Cursor
    task: Callable[[Any], Any]
    pool: Any
    depth: int
    in_order: bool
    timeout: float | None
    transfer: Callable[[Any], Any]
    stats: Any
    fallbacks: Any
    ledger: Any
    end: Callable[["EpochPass"], None]
    is_current: Callable[["EpochPass"], bool]
    steps: range = range(0)
    skip: frozenset[int] = frozenset()
    ids: Callable[[int], Any] | None = None
    sampler: Iterator[Any] | None = None
    batched: bool = True
    cache_clock: Callable[[int], Any] | None = None
    cache_events: "CacheEvents | None" = None
    workers: int = 1
    saved: dict[str, Any] | None = None
    group: int = 1
    open_ahead: Callable[[list[np.ndarray]], None] | None = None


class CacheEvents:
    """Writes what the node cache did since it was last asked (retries, quarantines,
    repairs) as ledger events, so a run's faults are on record next to the steps they
    delayed. One per loader: the counters it has written carry over between passes."""

    def __init__(self, cache: Any) -> None:
        self._cache, self._seen = cache, None

    def write(self, ledger: Any) -> None:
        now = self._cache.stats()
        for kind, name in _CACHE_EVENTS:
            n = getattr(now, name) - (getattr(self._seen, name) if self._seen is not None else 0)
            if n > 0:
                ledger.event(kind, count=n)
        self._seen = now


def cache_clock(cache: Any, order: Any, plan: Any, step: int, rank: int,
                world_size: int) -> Callable[[int], Any] | None:
    """Hand the cache every shard use from ``step`` on, repeats included
    (stoker.cache.future); returns ``clock(step)``, which moves the cache's cursor to the
    first position of ``step`` (``None``: the order cannot say where a step starts)."""
    steps = plan.steps_per_epoch
    start = plan.window(step)[0] if step < steps else 0
    uses = getattr(order, "shard_uses", None)
    if uses is None and not hasattr(order, "shard_sequence"):
        return None  # an order that cannot say (the cache then evicts the least recent)
    if uses is None:  # an order without spans: first uses, positional clock
        cache.set_future(order.shard_sequence(start, plan.num_samples, rank,
                                              world_size).tolist())
        return None
    shards, first, last = uses(start, plan.num_samples, rank, world_size)
    cache.set_future(shards, np.stack([first, last], axis=1))
    return lambda s: cache.advance_to(plan.window(s)[0]) if s < steps else None


class EpochPass:
    """What every pass over an epoch shares: stopping it ends it once (``run.end``: the
    workers are handed back or, persistent, keep running without its queued work; the
    ledger is flushed)."""

    _closed = True  # until a pass has started: nothing to stop
    _run: EpochRun

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._run.end(self)

    def __del__(self) -> None:
        if not sys.is_finalizing():  # at exit the loader's own close() has run, or never will
            self.close()


class EpochIterator(EpochPass):
    """One pass over (the rest of) an epoch; yields batches in sequence order (or as they
    are ready, with ``in_order=False``)."""

    _generation = 0

    def __init__(self, run: EpochRun) -> None:
        EpochIterator._generation += 1
        self._gen = EpochIterator._generation
        self._run = run
        self._closed = False
        self._steps = iter(run.steps)
        self._pending: list[tuple[int, Any]] = []
        run.stats.begin()

    def _next_task(self) -> tuple[int, Any] | None:
        """(step, ids): an int64 array, or without auto-collation the sampler's item."""
        run = self._run
        for step in self._steps:
            if run.ids is not None:
                if step not in run.skip:
                    return step, run.ids(step)
                continue
            item = next(run.sampler)  # type: ignore[arg-type]
            if step not in run.skip:
                return step, np.asarray(list(item), dtype=np.int64) if run.batched else item
        return None

    def _fill(self) -> None:
        run = self._run
        while run.pool is not None and len(self._pending) < run.depth:
            tasks = []
            while len(tasks) < run.group and (task := self._next_task()) is not None:
                tasks.append(task)
            if not tasks:
                return
            if run.open_ahead is not None:
                run.open_ahead([ids for _, ids in tasks])
            if len(tasks) == 1:
                run.pool.submit((self._gen, tasks[0][0]), (tasks[0][1], run.epoch, run.seed))
            else:
                run.pool.submit_group([(self._gen, step) for step, _ in tasks],
                                      [(ids, run.epoch, run.seed) for _, ids in tasks])
            self._pending.extend(tasks)

    def __iter__(self) -> "EpochIterator":
        return self

    def _take(self) -> tuple[int, Any, Any] | None:
        """The next (step, ids, Delivered): in step order, or with ``in_order=False`` whichever
        pending batch is ready first (as torch's ``in_order=False``)."""
        run = self._run
        if run.pool is None:
            task = self._next_task()
            if task is None:
                return None
            step, ids = task
            try:
                return step, ids, run.task((ids, run.epoch, run.seed))
            except Exception as exc:
                add_note(exc, f"(stoker: in batch {step}, in the main process)")
                raise
        self._fill()
        if not self._pending:
            return None
        seqs = [(self._gen, s) for s, _ in self._pending]
        seq, batch = run.pool.get_any(seqs if not run.in_order else seqs[:1], run.timeout)
        step, ids = self._pending.pop(seqs.index(seq))
        for restart in run.pool.take_restarts():
            if run.ledger is not None:
                run.ledger.event("worker_restart", **restart)
        self._fill()
        return step, ids, batch

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        run = self._run
        t0 = time.perf_counter()
        taken = self._take()
        if taken is None:
            return self._finish()
        step, ids, out = taken
        if out.fallbacks:
            run.fallbacks.add(out.fallbacks, run.ledger, run.epoch, step)
        if own := drain():
            run.fallbacks.add(own, run.ledger, run.epoch, step)
        run.stats.path("compiling" in out.fallbacks)
        batch = run.transfer(out.batch)
        waited = time.perf_counter() - t0
        if not isinstance(ids, np.ndarray):  # a sampler's own item (batch_size=None)
            ids = np.asarray(ids, dtype=np.int64).ravel() if run.ledger is not None \
                else np.zeros(np.size(ids), dtype=np.int64)
        between = run.stats.record(len(ids), waited)
        if run.ledger is not None:
            run.ledger.step(run.epoch, step, run.rank, ids, waited, between, out.content)
            if run.cache_events is not None:
                run.cache_events.write(run.ledger)
        run.cursor.advance(step)
        if run.cache_clock is not None:
            run.cache_clock(run.cursor.step)
        return batch

    def _finish(self) -> Any:
        run = self._run
        if run.ledger is not None:
            if run.cache_events is not None:
                run.cache_events.write(run.ledger)
            if run.stats.fallbacks:
                run.ledger.event("fallback_counts", epoch=run.epoch, counts=run.stats.fallbacks)
        if run.cursor.epoch == run.epoch and run.is_current(self):
            run.cursor.start_epoch(run.epoch + 1)
        self.close()
        raise StopIteration
