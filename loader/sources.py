"""What a DataLoader reads, opened from explicit values: a stoker dataset (its reader, node
cache and order plan), a mixture of them, or a torch dataset.

Everything here is decided once, at construction, from the DataLoader's arguments
(:class:`SourceSetup`); nothing reads the loader itself. Local shards are checked (present,
right size) before any worker starts; a cached dataset's order is planned against the cache's
limit (``stoker.loader.read.order_plan``), so an order that cannot fit is refused here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from torch.utils.data import IterableDataset
from torch.utils.data._utils.collate import default_collate, default_convert

from stoker.loader.iterable import IterableSource
from stoker.loader.options import LoaderOptions
from stoker.loader.order.epoch import OrderOptions
from stoker.loader.order.mixture import Mixture, MixtureError
from stoker.loader.read.arrow import ArrowSource
from stoker.loader.read.mixture import (MixtureSource, check_columns, is_mixture,
                                       reader_manifests)
from stoker.loader.read.mixture_budget import mixture_plan, split_cache_limit
from stoker.loader.read.order_plan import OrderPlan, plan_order, record_stride
from stoker.loader.read.torch_dataset import TorchSource
from stoker.manifest import Manifest, ManifestError, redact_url
from stoker.manifest.locations import records_dir

__all__ = ["Opened", "SourceSetup", "check_local_shards", "is_remote", "is_stoker_dataset",
           "open_source"]


@dataclass(frozen=True)
class SourceSetup:
    """The DataLoader's arguments that decide how its dataset is opened."""

    options: LoaderOptions
    columns: Sequence[str] | None
    batch_size: int | None
    auto_collation: bool
    collate_fn: Callable[[Any], Any] | None
    num_workers: int
    worker_mode: str
    world_size: int  # as resolved at construction; order options never depend on it
    pin: bool  # write batches into page-locked buffers (a GPU will copy them)
    ring_depth: int  # batch buffers in flight per reader
    sample_seeding: bool
    service: Any  # a stoker.loader.service.options.Service, or None


@dataclass(frozen=True)
class Opened:
    """An opened dataset: the reader, its node cache (``None``: read in place), the order plan
    of a stoker dataset (``None`` for a torch dataset), where it is (for messages and ledgers),
    and the collate functions: ``collate`` runs on a stoker batch (the user's ``collate_fn``,
    or nothing), ``collate_fn`` is what ``loader.collate_fn`` reports, as in torch."""

    source: Any
    cache: Any
    plan: OrderPlan | None
    location: str
    collate: Callable[[Any], Any] | None
    collate_fn: Callable[[Any], Any] | None


def is_stoker_dataset(dataset: Any) -> bool:
    """A path, URL, Manifest or Mixture (else a torch dataset)."""
    return isinstance(dataset, (str, os.PathLike, Manifest, Mixture))


def is_remote(root: str | None) -> bool:
    return bool(root) and "://" in root and not root.startswith("file://")  # type: ignore[operator]


def open_source(dataset: Any, setup: SourceSetup) -> Opened:
    """Open ``dataset`` as ``setup`` says.

    Raises:
        ValueError: ``batch_size=None`` for a stoker dataset; ``columns=`` / ``read=`` for a
            torch dataset.
        TypeError: ``dataset`` is none of the kinds a DataLoader reads.
        ManifestError, WorkingSetError: from the manifest and the order plan.
    """
    if is_stoker_dataset(dataset):
        if setup.batch_size is None:
            raise ValueError("batch_size=None (no batching) is supported for map-style torch "
                             "datasets only; pass batch_size >= 1 for a stoker dataset.")
        return _open_stoker(dataset, setup)
    collate_fn = setup.collate_fn or (default_collate if setup.auto_collation
                                      else default_convert)
    location = f"<{type(dataset).__name__}>"
    if isinstance(dataset, IterableDataset):  # torch's semantics, see stoker.loader.iterable
        return Opened(IterableSource(dataset), None, None, location, None, collate_fn)
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise TypeError(f"dataset must be a stoker dataset path/URL, a Manifest or a map-style "
                        f"torch Dataset with __len__ and __getitem__; got {type(dataset).__name__}")
    if setup.columns is not None or setup.options.read.used:
        raise ValueError("columns= and read=ReadOptions(...) apply to stoker datasets only")
    source = TorchSource(dataset, collate_fn, batched=setup.auto_collation,
                         seeding=setup.sample_seeding)
    return Opened(source, None, None, location, None, collate_fn)


def _open_stoker(dataset: Any, setup: SourceSetup) -> Opened:
    if is_mixture(dataset):  # stoker.loader.order.mixture
        return _open_mixture(dataset, setup)
    manifest = dataset if isinstance(dataset, Manifest) else \
        Manifest.load(os.fspath(dataset), setup.options.cache.storage_options)
    plan = _plan_order(manifest, setup)
    source, cache = _reader(manifest, setup, plan)
    return Opened(source, cache, plan, redact_url(manifest.root or ""), setup.collate_fn,
                  setup.collate_fn)


def _open_mixture(dataset: Any, setup: SourceSetup) -> Opened:
    """A mixture's source: its readers (one over every source when they allow it, else one
    per source, each cached one with its share of the cache limit) and one order plan."""
    read = setup.options.read
    mixture = dataset if isinstance(dataset, Mixture) else \
        Mixture.load(dataset, setup.options.cache.storage_options)
    location = repr(mixture) if isinstance(dataset, Mixture) else os.fspath(dataset)
    check_columns(mixture, setup.columns, read.features, read.categoricals, read.image)
    named = reader_manifests(mixture)
    plans = [_source_plan(name, manifest, setup) for name, manifest in named]
    shares = _cache_shares(named, plans, setup)
    source = MixtureSource(mixture, lambda m: _reader(m, setup, None, shares.get(id(m))),
                           pin=setup.pin, ring_depth=setup.ring_depth, named=named)
    # one order for every source: the options of the reader with the fewest partitions fit
    # every reader's working set
    plan = min(plans, key=lambda p: p.options.partitions)
    if source.union and len(mixture.names) > 1:  # each source stages its own rounds
        try:
            plan = mixture_plan(mixture.manifests, mixture.names, plan,
                                partitions=setup.options.order.partitions,
                                world_size=setup.world_size, readers=_readers(setup))
        except BaseException:
            source.close()
            raise
    return Opened(source, None, plan, location, setup.collate_fn, setup.collate_fn)


def _cached(manifest: Manifest, setup: SourceSetup) -> bool:
    """Whether ``manifest``'s shards are read through the node cache."""
    return setup.options.cache.dir is not None or is_remote(manifest.root)


def _source_plan(name: str, manifest: Manifest, setup: SourceSetup) -> OrderPlan:
    """:func:`_plan_order` of one reader of a mixture, its errors naming the source."""
    try:
        return _plan_order(manifest, setup)
    except ManifestError as exc:
        raise MixtureError(f"source {name!r}: {exc}") from None


def _cache_shares(named: list[tuple[str, Manifest]], plans: list[OrderPlan],
                  setup: SourceSetup) -> dict[int, int]:
    """``id(manifest)`` -> that reader's share of the cache limit
    (stoker.loader.read.mixture_budget), when two or more of a mixture's readers go through
    the cache and there is a limit; working sets are taken at the partitions the mixture's
    order uses (the fewest any reader's own plan chose)."""
    limit = setup.options.cache.limit
    cached = [(n, m, p) for (n, m), p in zip(named, plans) if _cached(m, setup)]
    if limit is None or len(cached) < 2:
        return {}
    fewest = min(p.options.partitions for p in plans)
    needs = [(p if p.options.partitions == fewest else _plan_order(m, setup, fewest)
              ).working_set.shard_bytes for _, m, p in cached]
    sizes = [int(m.shard_bytes.sum()) for _, m, _ in cached]
    shares = split_cache_limit(int(limit), needs, sizes, [n for n, _, _ in cached])
    return {id(m): share for (_, m, _), share in zip(cached, shares)}


def _reader(manifest: Manifest, setup: SourceSetup, plan: OrderPlan | None,
            limit: int | None = None) -> tuple[Any, Any]:
    """The reader of one stoker dataset and its shard cache (``None`` when local); ``plan``
    is ``None`` for a mixture's sources, ``limit`` a mixture source's share of the cache
    limit (``None``: the whole limit)."""
    read, cache_opts = setup.options.read, setup.options.cache
    if limit is None:
        limit = cache_opts.limit
    if setup.service is not None:  # batches come from `stoker serve`: no shard is opened
        from stoker.loader.service.source import ServiceSource

        return ServiceSource(manifest, setup.service, columns=setup.columns,
                             features=read.features, categoricals=read.categoricals,
                             image=read.image), None
    opener, max_open, cache = None, 256, None
    if _cached(manifest, setup):
        from stoker.loader.read.remote import open_cache, pin_bound

        max_open = pin_bound(manifest, setup.options.order.partitions
                             or OrderOptions().partitions, setup.world_size,
                             setup.num_workers, limit) \
            if plan is None else _pins(manifest, plan, setup)
        cache, opener = open_cache(manifest, cache_opts.dir, limit,
                                   cache_opts.storage_options, max_open,
                                   cache_opts.shard_cache_kwargs())
    elif manifest.kind == "arrow":
        check_local_shards(manifest)
    make: Any = ArrowSource
    extra: dict[str, Any] = {}
    if manifest.kind != "arrow":  # files indexed in place by `stoker index`
        from stoker.loader.read.indexed.source import IndexSource

        make = IndexSource
        if manifest.kind == "parquet-index" and plan is not None:  # decoded row groups
            extra["cache_bytes"] = max(1 << 26, plan.working_set.shard_bytes)
    where = read.records_dir
    source = make(manifest, **extra, columns=setup.columns, features=read.features,
                  opener=opener, max_open=max_open, categoricals=read.categoricals,
                  image=read.image, pin=setup.pin, row_major=read.row_major,
                  row_major_dir=None if where is False else records_dir(where, cache_opts.dir),
                  ring_depth=setup.ring_depth)
    return source, cache


def _plan_order(manifest: Manifest, setup: SourceSetup,
                partitions: int | None = None) -> OrderPlan:
    """Order options of a stoker dataset, checked against the node's budgets
    (stoker.loader.read.order_plan); independent of the world size. ``partitions``
    overrides the options' (a mixture's sources at the mixture's partitions)."""
    opts, read = setup.options, setup.options.read
    return plan_order(
        manifest, shuffle=opts.shuffle, partitions=partitions or opts.order.partitions,
        block_size=opts.order.block_size, partition_mode=opts.order.partition_mode,
        batch_size=setup.batch_size, world_size=setup.world_size,
        stride=record_stride(manifest, setup.columns, read.features, read.categoricals,
                             read.image),
        cache_limit=opts.cache.limit if _cached(manifest, setup) else None,
        readers=_readers(setup))


def _readers(setup: SourceSetup) -> int:
    """Processes that stage on their own: worker processes and the loader's (else 1)."""
    return setup.num_workers + 1 if setup.worker_mode == "process" and setup.num_workers else 1


def _pins(manifest: Manifest, plan: OrderPlan, setup: SourceSetup) -> int:
    """Shards the reader may keep pinned: its working set, never more than the limit holds
    beside one shard being admitted (resident, unpinned shards are kept by Belady, not by
    pins); one per worker process (pins add up across them, and one waiting for room another
    pins can wait on it in turn; a closed shard stays readable through its mapping)."""
    if setup.worker_mode == "process" and setup.num_workers:
        return 1
    pins = max(1, plan.working_set.shards)
    limit = setup.options.cache.limit
    if limit is not None and manifest.num_shards:
        pins = max(1, min(pins, limit // int(manifest.shard_bytes.max()) - 1))
    return pins


def check_local_shards(manifest: Manifest) -> None:
    """Every local shard exists with the size its manifest records (one ``stat`` each).

    Without a cache nothing verifies local shards as they are read, so a truncated or
    replaced file is refused here, before any worker starts, instead of surfacing as an Arrow
    decoding error (or wrong data) in the middle of an epoch.
    """
    for i, shard in enumerate(manifest.shards):
        path = manifest.shard_location(i).removeprefix("file://")
        try:
            size = os.stat(path).st_size
        except OSError as exc:
            raise ManifestError(f"shard {i} ({shard.path!r}) cannot be read at {path} "
                                f"({type(exc).__name__}: {exc.strerror}); the dataset is "
                                "incomplete. Restore the file or re-create the dataset with "
                                "`stoker shard`.", field="shards") from None
        if size != shard.bytes:
            raise ManifestError(f"shard {i} ({shard.path!r}) has {size} bytes at {path}, the "
                                f"manifest says {shard.bytes}; the file was truncated or "
                                "replaced. Restore it or re-create the dataset with "
                                "`stoker shard`.", field="shards")
