"""``stoker.loader.DataLoader``: a drop-in ``torch.utils.data.DataLoader`` with an order contract.

For a stoker dataset (path, URL or Manifest) and for any map-style torch ``Dataset`` without a
sampler, the sample order of an epoch is a pure function of (dataset fingerprint, seed,
epoch, order options); batches are computed by workers and yielded in sequence order, and
``state_dict()`` / ``load_state_dict()`` resume with exactly the next sample, also with another
``num_workers`` or world size. With a user ``sampler`` / ``batch_sampler`` the order is the
sampler's, exactly as in torch.

It is a ``torch.utils.data.DataLoader`` subclass (frameworks check ``isinstance`` before they
wrap, re-shard or move a loader) that replaces torch's iteration with stoker's; torch's
``__init__`` is not run, its argument checks, warnings and attribute guards are kept.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable, Iterator, Sequence, TypeVar

import numpy as np
import torch
from torch.utils.data import BatchSampler, IterableDataset, Sampler
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data.dataloader import _InfiniteConstantSampler

from stoker.loader.distributed import resolve_world
from stoker.loader.errors import OptionsError
from stoker.loader.epoch_iter import (BatchTask, CacheEvents, EpochIterator, EpochPass, EpochRun,
                                     cache_clock)
from stoker.loader.fallbacks import FallbackAccount
from stoker.loader.fastpath import warm
from stoker.loader.iterable import IterableEpoch, IterableTask
from stoker.loader.ledger.digest import content_header
from stoker.loader.loader_state import Resumable
from stoker.loader.loader_world import WorldPlan
from stoker.loader.options import (CacheOptions, LedgerOptions, ReadOptions, ShuffleOptions,
                                   WorkerOptions, resolve_options)
from stoker.loader.options.torch_args import check_sampling_args, check_worker_args
from stoker.loader.run_ledger import open_ledger
from stoker.loader.samplers import OrderBatchSampler, OrderSampler
from stoker.loader.service.options import service_for
from stoker.loader.sources import SourceSetup, is_stoker_dataset, open_source
from stoker.loader.order.mixture_order import source_order
from stoker.loader.order.working_set import WorkingSet
from stoker.loader.order.schedule import batch_ids
from stoker.loader.order.windows import ChunkThread
from stoker.loader.state import Cursor, LoaderState
from stoker.loader.stats import LoaderStats
from stoker.loader.transfer import Transfer
from stoker.loader.workers.pool import ThreadPool, WorkerPool, WorkerSetup, make_pool
from stoker.loader.workers.seed import resolve_seed, worker_base_seed

__all__ = ["DataLoader"]

_GROUP_MAX = 8  # batches in one worker task at most (see DataLoader._group)

T_co = TypeVar("T_co", covariant=True)


def _check_forked(context: Any) -> None:
    """Process workers over a stoker dataset are forked: each inherits the open source (its
    mapped shards, buffers, record tables, threads), which cannot be pickled to a spawned
    worker. Refused here, by name, rather than as a pickling ``TypeError`` at the first
    batch."""
    method = None if context is None else context.get_start_method()
    if method not in (None, "fork"):
        raise OptionsError(
            f"multiprocessing_context={method!r}: process workers over a stoker dataset are "
            "forked (they inherit its open shards and buffers, which cannot be sent to a "
            f"{method!r} worker); leave multiprocessing_context unset or 'fork', or use "
            "WorkerOptions(mode='thread') (the default for stoker datasets) or num_workers=0. "
            "A torch Dataset runs in spawned workers as with torch.")


class DataLoader(WorldPlan, Resumable, TorchDataLoader[T_co]):
    """Iterable over batches, accepting ``torch.utils.data.DataLoader``'s arguments.

    Args beyond torch's (ten; the rest are option objects, see ``stoker.loader.options``):
        shuffle: torch's flag, or a ``ShuffleOptions`` (shuffle, with those order options).
        seed: the order seed; default drawn from ``generator`` or torch's global RNG (recorded).
        columns: columns to read from a stoker dataset (default all).
        transform: a function applied to each whole batch inside the workers.
        rank, world_size: default resolved when iteration starts: torch.distributed's process
            group, else RANK (or LOCAL_RANK + NODE_RANK * LOCAL_WORLD_SIZE) / WORLD_SIZE.
        device: move batches there (``"cuda"``: pinned host buffers + side-stream copies).
        cache: a directory or a ``CacheOptions``: the node-local cache of a remote dataset
            (a local dataset is read in place unless a directory is given).
        ledger: a path or a ``LedgerOptions``: write a reproducibility ledger there.
        read: ``ReadOptions``: stacked features and categoricals, images, row-major records.
        workers: ``WorkerOptions``: thread or process workers, per-sample seeding, or
            ``stoker serve`` servers computing the batches.
        **deprecated: the keywords these options replaced (``partitions=``, ``cache_limit=``,
            ``worker_mode=``, ...; CHANGELOG.md): accepted for one release with a
            ``StokerDeprecationWarning`` naming the new spelling.

    ``batch_size`` is per rank, as in torch DDP: the global batch is ``batch_size * world_size``.
    """

    # Accelerate's prepare() rebuilds every DataLoader as its own torch loader over
    # ``.dataset``; stoker already shards by rank (resolved from the process group Accelerate
    # creates), so it is handed back as it is. Pass device= to have batches moved.
    _is_accelerate_prepared = True

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | ShuffleOptions | None = None,
        sampler: Sampler | Sequence[int] | None = None,
        batch_sampler: Sampler[list[int]] | Sequence[list[int]] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[Any], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        seed: int | None = None,
        columns: Sequence[str] | None = None,
        transform: Callable[[Any], Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        device: str | torch.device | None = None,
        cache: str | os.PathLike[str] | CacheOptions | None = None,
        ledger: str | os.PathLike[str] | LedgerOptions | None = None,
        read: ReadOptions | None = None,
        workers: WorkerOptions | None = None,
        **deprecated: Any,
    ) -> None:
        check_worker_args(num_workers, timeout, prefetch_factor, persistent_workers)
        opts = resolve_options(shuffle, read, cache, ledger, workers, deprecated)
        self.num_workers = num_workers
        self.multiprocessing_context = multiprocessing_context  # torch's property validates
        check_sampling_args(isinstance(dataset, IterableDataset), batch_size, shuffle, sampler,
                            batch_sampler, drop_last)
        auto_collation = batch_size is not None or batch_sampler is not None
        if batch_sampler is not None:  # as torch: the batch sampler decides
            batch_size, drop_last = None, False
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.prefetch_factor = prefetch_factor if num_workers == 0 or prefetch_factor is not None \
            else 2
        self._prefetch = self.prefetch_factor or 2
        self.persistent_workers = persistent_workers
        self.pin_memory, self.pin_memory_device = pin_memory, pin_memory_device
        self.in_order = bool(in_order)
        self.generator = generator
        self.transform = transform
        self._options = opts
        self.sample_seeding = opts.workers.sample_seeding
        self.worker_mode = opts.workers.mode or (
            "thread" if is_stoker_dataset(dataset) else "process")
        if num_workers and self.worker_mode == "process" and is_stoker_dataset(dataset):
            _check_forked(self.multiprocessing_context)
        self._world_arg = (rank, world_size)
        self._world: tuple[int, int] | None = None
        # the fast path writes batches straight into page-locked buffers when they will be
        # copied to a GPU (see stoker.loader.transfer)
        wants_gpu = pin_memory or bool(pin_memory_device) or str(device or "").startswith("cuda")
        self._service = None if opts.workers.service is None else \
            service_for(opts.workers.service, dataset)
        opened = open_source(dataset, SourceSetup(
            opts, columns, batch_size, auto_collation, collate_fn, num_workers, self.worker_mode,
            world_size=resolve_world(rank, world_size)[1],
            pin=bool(wants_gpu) and torch.cuda.is_available(),
            ring_depth=max(8, num_workers * self._prefetch + 3),
            sample_seeding=self.sample_seeding, service=self._service))
        self._source, self._cache, self.location = opened.source, opened.cache, opened.location
        if opts.shuffle and not getattr(self._source, "numba_free", False):
            # Numba's start-up runs while the caller builds its model; natural order needs no
            # order kernel (O[k] = k), and a source whose batches use kernels warms its own
            warm.prime()
        self._order_plan = opened.plan  # stoker datasets: order options + working set
        self._collate, self.collate_fn = opened.collate, opened.collate_fn
        self._mode = "iterable" if self._source.kind == "iterable" else "sampler" \
            if (sampler is not None or batch_sampler is not None) else "order"
        if self._mode == "iterable":  # torch's placeholders: an IterableDataset has no sampler
            self.sampler = _InfiniteConstantSampler()
            self.batch_sampler = BatchSampler(self.sampler, batch_size, drop_last) \
                if batch_size is not None else None
        elif self._mode == "sampler":
            self.sampler = sampler
            self.batch_sampler = batch_sampler if batch_sampler is not None or batch_size is None \
                else BatchSampler(sampler, batch_size, drop_last)  # type: ignore[arg-type]
            if world_size is not None and world_size > 1:
                raise ValueError("with a sampler or batch_sampler the sampler decides what each "
                                 "rank reads (e.g. DistributedSampler); leave world_size at 1 or "
                                 "drop the sampler to use stoker's partitioned order.")
        else:
            self.sampler = OrderSampler(self)
            self.batch_sampler = OrderBatchSampler(self, self.sampler) if auto_collation else None
        # batches read ahead in a stoker thread with num_workers=0: only where no user code
        # runs in a batch, so nothing the caller can observe but the time it waits
        self._reads_ahead = (num_workers == 0 and opts.workers.read_ahead and
                             self._mode == "order" and is_stoker_dataset(dataset) and
                             self._service is None and self._collate is None and
                             transform is None)
        self.seed = resolve_seed(seed, generator)
        self._cursor = Cursor()  # epoch, next step, steps yielded ahead (in_order=False)
        self._loaded: LoaderState | None = None  # a loaded state not yet iterated from
        self._configure(resolve_world(rank, world_size))
        self._pool: WorkerPool | None = None
        self._order_thread = ChunkThread()  # a shuffled order's next chunks (order.windows)
        self._active: EpochIterator | None = None
        self._transfer = Transfer(pin_memory=pin_memory or bool(pin_memory_device),
                                  device=device or (pin_memory_device or None),
                                  depth=self._prefetch)
        self.stats = LoaderStats()
        self._fallbacks = FallbackAccount(self.stats.fallbacks)
        self._ledger = None
        self._resumed_from: dict[str, Any] | None = None
        self._cache_events = CacheEvents(self._cache) if self._cache is not None else None
        self._content = content_header(self._source) \
            if opts.ledger is not None and opts.ledger.content else None
        self._iterable_state: dict[str, Any] | None = None  # loaded, for the next pass
        self._task = IterableTask(dataset, self.collate_fn, batch_size, drop_last,
                                  self._content is not None, self.worker_mode == "thread") \
            if self._mode == "iterable" else \
            BatchTask(self._source, self._collate, transform, self.sample_seeding,
                      self._content["columns"] if self._content else None)
        self._DataLoader__initialized = True  # torch's guard: batch_size, sampler, ... are fixed
        self.check_worker_number_rationality()

    # -- torch-compatible surface -----------------------------------------------------------
    def __len__(self) -> int:
        if self._mode == "iterable":  # torch's: the dataset's len() in batches
            n, size = len(self.dataset), self.batch_size or 1
            return n // size if self.drop_last else -(-n // size)
        if self._mode == "sampler":
            return len(self._batches_from_sampler())  # type: ignore[arg-type]
        return self._configured().steps_per_epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration reads; keeps a resumed mid-epoch position."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch != self._cursor.epoch:
            self._cursor.start_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self._cursor.epoch

    @property
    def working_set(self) -> WorkingSet | None:
        """What one rank of this loader needs live at once, computed at construction from the
        order options, world size, workers and shard sizes (stoker.loader.order.working_set):
        shards and their bytes, staged rows and their bytes. Recorded in the ledger's header;
        ``None`` for a torch dataset (it has no stoker order)."""
        return None if self._order_plan is None else self._order_plan.working_set

    def __iter__(self) -> Iterator[Any]:
        if self._active is not None:
            self._active.close()
        self._configured()  # rank and world size as the process group has them now
        if self.num_workers:
            self.check_worker_number_rationality()  # torch warns at every iter() too
        if self._mode == "iterable":
            self._active = IterableEpoch(self._epoch_run())
            return self._active
        if self._cursor.step >= len(self):  # a state saved right at the end of an epoch
            self._cursor.start_epoch(self._cursor.epoch + 1)
        self._loaded = None
        self._active = EpochIterator(self._epoch_run())
        return self._active

    # -- internals ---------------------------------------------------------------------------
    def _epoch_run(self) -> EpochRun:
        """What the next pass needs, as values (stoker.loader.epoch_iter.EpochRun)."""
        ledger = self._ledger_writer()  # first: a ledger that refuses this loader starts nothing
        cursor, rank = self._cursor, self.rank
        run = functools.partial(
            EpochRun, epoch=cursor.epoch, seed=self.seed, rank=rank, cursor=cursor,
            task=self._task, in_order=self.in_order,
            timeout=(self.timeout or None) if self.num_workers else None,  # as torch
            transfer=self._transfer, stats=self.stats, fallbacks=self._fallbacks, ledger=ledger,
            end=self._end_pass, is_current=lambda p: self._active is p)
        if self._mode == "iterable":
            saved, self._iterable_state = self._iterable_state, None
            return run(pool=self._get_pool(targeted=True), depth=self.num_workers * self._prefetch,
                       workers=max(self.num_workers, 1), saved=saved)
        if self._mode == "order":
            order = source_order(self._source, self.seed, cursor.epoch, self.order_options)
            plan = self._plan
            steps = range(cursor.step, plan.steps_per_epoch)
            where = dict(ids=batch_ids(order, plan, self._order_thread.ahead))
            if self._cache is not None:
                where.update(cache_events=self._cache_events, cache_clock=cache_clock(
                    self._cache, order, plan, cursor.step, rank, self.world_size))
            elif hasattr(self._source, "cache_clock"):  # a mixture: caches of its own
                where.update(cache_clock=self._source.cache_clock(order, plan, cursor.step))
        else:
            batches = self._batches_from_sampler()
            sampler = iter(batches)
            for _ in range(cursor.step):
                next(sampler)
            steps = range(cursor.step, len(batches))
            where = dict(sampler=sampler, batched=self.batch_sampler is not None)
        open_ahead = self._open_ahead() if "ids" in where else None
        if open_ahead is not None:
            where["open_ahead"] = functools.partial(open_ahead, wait=False)  # once forked
            if self._pool is None:
                # the shards of the workers' first tasks open here and the workers inherit
                # them; their records build after the forks (a fork waits for a build)
                from stoker.loader.workers.processes import quiet_for_forks

                with quiet_for_forks():  # busy: each fork below counts it
                    first = steps[:self.num_workers * self._prefetch * self._group()]
                    if len(first):
                        open_ahead([where["ids"](step) for step in first])
                    self._get_pool()
        elif "ids" in where:
            where["open_ahead"] = self._open_next()
        pool = self._get_pool()
        group = self._group() if hasattr(pool, "submit_group") else 1
        depth = getattr(pool, "depth", 0) or max(self.num_workers, 1) * self._prefetch * group
        return run(pool=pool, depth=max(depth, 1), steps=steps, skip=frozenset(cursor.ahead),
                   group=group, **where)

    def _open_ahead(self) -> Callable[[list[np.ndarray]], None] | None:
        """With process workers, what opens in this process the shards of the ids handed out
        (ArrowSource.open_for_workers): workers forked after it inherit those maps, and this
        process builds and saves their row-major records, which the workers then map (a
        forked worker builds none of its own under ``row_major="auto"``)."""
        if self.worker_mode != "process" or not self.num_workers or self._service is not None:
            return None  # servers read the batches, not this process
        return getattr(self._source, "open_for_workers", None)

    def _open_next(self) -> Callable[[list[np.ndarray]], None] | None:
        """In natural order, where this process reads the batches (thread workers, the
        reader thread), what opens the next shard before a batch reaches it
        (ArrowSource.open_next)."""
        if self.order_options.shuffle or self._service is not None or \
                self.num_workers and self.worker_mode == "process":
            return None
        return getattr(self._source, "open_next", None)

    def _group(self) -> int:
        """Batches per worker task: enough rows that one record gather's nogil copy outlasts
        the ~30 us a thread waits to get the GIL back (ArrowSource.fetch_group), and a
        process worker's pipe messages are one per group; 1 where the source cannot group."""
        rows = getattr(self._source, "group_rows", 0)
        if not rows or self._mode != "order" or self.batch_size is None:
            return 1
        return max(1, min(_GROUP_MAX, rows // max(1, self.batch_size)))

    def _end_pass(self, done: EpochPass) -> None:
        """A pass stopped: hand the workers back (persistent ones keep running, without its
        queued work), flush the ledger, forget the pass."""
        if self._pool is not None:
            if self.persistent_workers:
                self._pool.discard_pending()
            else:
                self._release_pool()
        if self._ledger is not None:
            self._ledger.flush()
        if self._active is done:
            self._active = None

    def _batches_from_sampler(self) -> Any:
        """What the sampler hands out: batches of indices, or (``batch_size=None``) whatever
        the sampler yields, each passed to ``dataset[...]`` as it is (as in torch)."""
        return self.batch_sampler if self.batch_sampler is not None else self.sampler

    def _get_pool(self, targeted: bool = False) -> WorkerPool | None:
        if self._service is not None and self._mode == "order":
            if self._pool is None:
                from stoker.loader.service.pool import ServicePool

                self._pool = ServicePool(self, self._task)
            return self._pool
        if self.num_workers == 0:
            if self._reads_ahead and self._pool is None:
                self._pool = ThreadPool(self._task, WorkerSetup(1, group=self._group()),
                                        mode="reader")
            return self._pool
        if self._pool is None:
            setup = WorkerSetup(self.num_workers, self.worker_init_fn,
                                worker_base_seed(self.seed, self._cursor.epoch), self.dataset,
                                self.multiprocessing_context, targeted,
                                1 if targeted else self._group())
            self._pool = make_pool(self._task, self.worker_mode, setup)
        return self._pool

    def _release_pool(self) -> None:
        if self._pool is not None and not self.persistent_workers:
            self._pool.close()
            self._pool = None

    def _ledger_writer(self) -> Any:
        if self._options.ledger is None or self._ledger is not None:
            return self._ledger
        self._ledger = open_ledger(self)
        return self._ledger

    def close(self) -> None:
        """Stop workers, flush the ledger, release the cache; idempotent."""
        if self._active is not None:
            self._active.close()
            self._active = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        self._order_thread.close()
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None
        self._source.close()
        if self._cache is not None:
            self._cache.close()
            self._cache = None
        self._transfer.close()

    def __del__(self) -> None:
        if not sys.is_finalizing() and hasattr(self, "_transfer"):  # built fully, not at exit
            self.close()

