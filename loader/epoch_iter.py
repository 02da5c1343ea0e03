"""One pass over an epoch: tasks to workers in order, batches back in sequence order.

Split from ``dataloader.py``: the DataLoader owns configuration and state, an
:class:`EpochIterator` owns one iteration (the order of its epoch, the pending tasks, the
ledger records of the steps it yields).
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import numpy as np

from stoker.loader.workers.failure import add_note
from stoker.loader.ledger.digest import batch_digests
from stoker.loader.fallbacks import Noted, collecting
from stoker.loader.order.mixture_order import source_order
from stoker.loader.workers.sample_rng import batch_seed
from stoker.loader.order.schedule import rank_batch_ids
from stoker.loader.workers.info import user_code

if TYPE_CHECKING:
    from stoker.loader.dataloader import DataLoader

__all__ = ["BatchTask", "Delivered", "EpochIterator", "EpochPass"]


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
            batch = self.source.fetch(ids, epoch, seed)
        digests = batch_digests(batch, self.content) if self.content is not None else None
        return Delivered(self.finish(batch, ids, epoch, seed), digests, noted)

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


class EpochPass:
    """What every pass over an epoch shares: stopping it hands the workers back (or keeps
    persistent ones, dropping their queued work) and flushes the ledger; idempotent."""

    _closed = True  # until a pass has started: nothing to stop
    _loader: DataLoader
    _pool: Any = None
    _ledger: Any = None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        loader = self._loader
        if self._pool is not None:
            if loader.persistent_workers:
                self._pool.discard_pending()
            else:
                loader._release_pool()
        if self._ledger is not None:
            self._ledger.flush()
        if loader._active is self:
            loader._active = None

    def __del__(self) -> None:
        if not sys.is_finalizing():  # at exit the loader's own close() has run, or never will
            self.close()


def _set_future(cache: Any, order: Any, plan: Any, loader: DataLoader) -> Any:
    """Hand the cache every shard use from the loader's position on, repeats included
    (stoker.cache.future); returns ``clock(step)``, which moves the cache's cursor to the
    first position of ``step``."""
    steps = plan.steps_per_epoch
    start = plan.window(loader._step)[0] if loader._step < steps else 0
    uses = getattr(order, "shard_uses", None)
    if uses is None and not hasattr(order, "shard_sequence"):
        return None  # an order that cannot say (the cache then evicts the least recent)
    if uses is None:  # an order without spans: first uses, positional clock
        cache.set_future(order.shard_sequence(start, plan.num_samples, loader.rank,
                                              loader.world_size).tolist())
        return None
    shards, first, last = uses(start, plan.num_samples, loader.rank, loader.world_size)
    cache.set_future(shards, np.stack([first, last], axis=1))
    return lambda step: cache.advance_to(plan.window(step)[0]) if step < steps else None


class EpochIterator(EpochPass):
    """One pass over (the rest of) an epoch; yields batches in sequence order (or as they
    are ready, with ``in_order=False``)."""

    _generation = 0
    _cache_clock: Any = None

    def __init__(self, loader: DataLoader) -> None:
        EpochIterator._generation += 1
        self._gen = EpochIterator._generation
        self._loader = loader
        self._epoch = loader._epoch
        self._closed = False
        self._pool = self._ledger = None
        # first: a ledger that refuses this loader (another writer, a restart) starts nothing
        self._ledger = loader._ledger_writer()
        if loader._mode == "order":
            order = source_order(loader._source, loader.seed, self._epoch, loader.order_options)
            plan = loader._plan
            self._ids = lambda step: rank_batch_ids(order, plan, step)
            self._steps = iter(range(loader._step, plan.steps_per_epoch))
            cache = loader._cache
            if cache is not None:
                self._cache_clock = _set_future(cache, order, plan, loader)
        else:
            batches = loader._batches_from_sampler()
            it = iter(batches)
            for _ in range(loader._step):
                next(it)
            self._sampler_it = it
            self._ids = None
            self._steps = iter(range(loader._step, len(batches)))
        self._skip = frozenset(loader._ahead)  # yielded before a resume (in_order=False)
        self._batched = loader.batch_sampler is not None
        self._pool = loader._get_pool()
        self._pending: list[tuple[int, Any]] = []
        self._submitted = 0
        depth = getattr(self._pool, "depth", 0) or loader.num_workers * loader._prefetch
        self._depth = max(depth, 1)
        loader.stats.begin()

    def _next_task(self) -> tuple[int, Any] | None:
        """(step, ids): an int64 array, or without auto-collation the sampler's item."""
        for step in self._steps:
            if self._ids is not None:
                if step not in self._skip:
                    return step, self._ids(step)
                continue
            item = next(self._sampler_it)
            if step not in self._skip:
                return step, np.asarray(list(item), dtype=np.int64) if self._batched else item
        return None

    def _fill(self) -> None:
        while self._pool is not None and len(self._pending) < self._depth:
            task = self._next_task()
            if task is None:
                return
            self._pool.submit((self._gen, task[0]), (task[1], self._epoch, self._loader.seed))
            self._pending.append(task)

    def __iter__(self) -> "EpochIterator":
        return self

    def _take(self) -> tuple[int, Any, Any] | None:
        """The next (step, ids, Delivered): in step order, or with ``in_order=False`` whichever
        pending batch is ready first (as torch's ``in_order=False``)."""
        loader = self._loader
        if self._pool is None:
            task = self._next_task()
            if task is None:
                return None
            step, ids = task
            try:
                return step, ids, loader._task((ids, self._epoch, loader.seed))
            except Exception as exc:
                add_note(exc, f"(stoker: in batch {step}, in the main process)")
                raise
        self._fill()
        if not self._pending:
            return None
        seqs = [(self._gen, s) for s, _ in self._pending]
        seq, batch = self._pool.get_any(seqs if not loader.in_order else seqs[:1],
                                        loader.timeout or None)
        step, ids = self._pending.pop(seqs.index(seq))
        for restart in self._pool.take_restarts():
            if self._ledger is not None:
                self._ledger.event("worker_restart", **restart)
        self._fill()
        return step, ids, batch

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        loader = self._loader
        t0 = time.perf_counter()
        taken = self._take()
        if taken is None:
            return self._finish()
        step, ids, out = taken
        if out.fallbacks:
            loader._fallbacks.add(out.fallbacks, self._ledger, self._epoch, step)
        loader.stats.path("compiling" in out.fallbacks)
        batch = loader._transfer(out.batch)
        waited = time.perf_counter() - t0
        if not isinstance(ids, np.ndarray):  # a sampler's own item (batch_size=None)
            ids = np.asarray(ids, dtype=np.int64).ravel() if self._ledger is not None \
                else np.zeros(np.size(ids), dtype=np.int64)
        between = loader.stats.record(len(ids), waited)
        if self._ledger is not None:
            self._ledger.step(self._epoch, step, loader.rank, ids, waited, between, out.content)
            self._cache_events()
        self._advance(step)
        if self._cache_clock is not None:
            self._cache_clock(loader._step)
        return batch

    def _advance(self, step: int) -> None:
        """Record ``step`` as yielded: the loader's position is the first step not yet
        yielded; steps yielded ahead of it (``in_order=False``) are kept for the state."""
        loader = self._loader
        if step != loader._step:
            loader._ahead.add(step)
            return
        loader._step = step + 1
        while loader._step in loader._ahead:
            loader._ahead.discard(loader._step)
            loader._step += 1

    def _cache_events(self) -> None:
        """Write what the cache did since the last batch (retries, quarantines, repairs) as
        ledger events, so a run's faults are on record next to the steps they delayed."""
        cache, ledger = self._loader._cache, self._ledger
        if cache is None or ledger is None:
            return
        now = cache.stats()
        seen = self._loader._cache_seen
        for kind, field in _CACHE_EVENTS:
            n = getattr(now, field) - (getattr(seen, field) if seen is not None else 0)
            if n > 0:
                ledger.event(kind, count=n)
        self._loader._cache_seen = now

    def _finish(self) -> Any:
        loader = self._loader
        self._cache_events()
        if self._ledger is not None and loader.stats.fallbacks:
            self._ledger.event("fallback_counts", epoch=self._epoch, counts=loader.stats.fallbacks)
        if loader._epoch == self._epoch and loader._active is self:
            loader._epoch, loader._step, loader._ahead = self._epoch + 1, 0, set()
        self.close()
        raise StopIteration
