"""The DataLoader's option objects: small, frozen, checked at construction.

``stoker.loader.DataLoader`` takes torch's arguments and ten of its own; everything else is
grouped here by what it decides (as Grain groups its options):

* :class:`ShuffleOptions` (``shuffle=``): how a shuffled order is built (partitions, blocks).
* :class:`ReadOptions` (``read=``): what a batch of a stoker dataset holds and how rows are
  laid out for reading (stacked features and categoricals, images, row-major records).
* :class:`CacheOptions` (``cache=``): where and how much of a remote dataset the node keeps.
* :class:`LedgerOptions` (``ledger=``): the reproducibility ledger.
* :class:`WorkerOptions` (``workers=``): how batches are computed (threads, processes, servers).

Each is validated in ``__post_init__``: a bad value raises :class:`OptionsError` (or the
order's :class:`OrderError`, both ``ValueError``) naming the option, the value and the fix,
before any shard is opened.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from stoker.loader.errors import OptionsError
from stoker.loader.fastpath.images import ImageOptions
from stoker.loader.order.epoch import OrderOptions
from stoker.manifest.sizes import parse_size

__all__ = ["CacheOptions", "LedgerOptions", "ReadOptions", "ShuffleOptions", "WorkerOptions"]

ROW_MAJOR_MODES = ("auto", True, False, "staged")
WORKER_MODES = (None, "thread", "process")


def _names(value: Sequence[str] | None, what: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise OptionsError(f"{what}={value!r} must be a list of column names, e.g. "
                           f"{what}=['a', 'b'].")
    return tuple(value)


def _path(value: Any, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise OptionsError(f"{what}={value!r} must be a path (str or os.PathLike) or None.")
    return os.fspath(value)


@dataclass(frozen=True, slots=True)
class ShuffleOptions:
    """How a shuffled order is built; pass it as ``shuffle=ShuffleOptions(...)`` (it means
    ``shuffle=True`` with these options). See ``stoker.loader.order.epoch.OrderOptions``.

    Attributes:
        partitions: ``P``, the canonical partitions; the global batch sequence is the same for
            every world size dividing ``P``. ``None``: sized by the order's working set
            (``stoker.loader.read.order_plan``), never by the world size.
        block_size: samples per shuffle block; ``0``: auto (a few shards' rows).
        partition_mode: ``"redraw"`` (re-draw each partition's shards every epoch) or
            ``"fixed"`` (keep them, so each node's cache stays useful).
    """

    partitions: int | None = None
    block_size: int = 0
    partition_mode: str = "redraw"

    def __post_init__(self) -> None:
        OrderOptions(shuffle=True, partitions=1 if self.partitions is None else self.partitions,
                     block_size=self.block_size, partition_mode=self.partition_mode)

    def __bool__(self) -> bool:  # torch's checks read ``shuffle`` as a truth value
        return True


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """What a batch of a stoker dataset holds beside ``columns``, and how rows are read.

    Attributes:
        features: numeric columns stacked into ``batch["features"]``, float32 ``[B, K]``.
        categoricals: integer or dictionary columns stacked into ``batch["categoricals"]``,
            int64 ``[B, C]`` (nulls -> 0).
        image: decode (and augment) a binary column into ``[B, H, W, 3]``.
        row_major: ``"auto"`` (default): fixed-width outputs of open shards are read from
            row-major records (one fused gather per batch; bitwise-equal batches), bounded;
            ``True``: always; ``False``: never; ``"staged"``: shuffled reads always stage
            their blocks (see ``stoker.loader.read.arrow.ArrowSource``).
        records_dir: where those records are kept as files, built once per node and mapped by
            every later process; ``None``: the default (``stoker.manifest.locations``);
            ``False``: memory only.
    """

    features: Sequence[str] | None = None
    categoricals: Sequence[str] | None = None
    image: ImageOptions | None = None
    row_major: bool | str = "auto"
    records_dir: str | os.PathLike[str] | bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "features", _names(self.features, "features"))
        object.__setattr__(self, "categoricals", _names(self.categoricals, "categoricals"))
        if self.image is not None and not isinstance(self.image, ImageOptions):
            raise OptionsError(f"image={self.image!r} must be an ImageOptions(column=..., "
                               "size=(h, w)) or None.")
        if not any(self.row_major is m or (isinstance(m, str) and self.row_major == m)
                   for m in ROW_MAJOR_MODES):
            raise OptionsError(f"row_major={self.row_major!r} is not supported; use 'auto', "
                               "True, False or 'staged'.")
        if self.records_dir is True:
            object.__setattr__(self, "records_dir", None)
        elif self.records_dir is not False:
            object.__setattr__(self, "records_dir", _path(self.records_dir, "records_dir"))

    @property
    def used(self) -> bool:
        """Whether anything beyond the defaults is asked for (stoker datasets only)."""
        return self != ReadOptions()


@dataclass(frozen=True, slots=True)
class CacheOptions:
    """The node-local cache of a remote (or explicitly cached) dataset.

    Attributes:
        dir: the cache directory; ``None``: the default (``stoker.manifest.locations``).
        limit: most bytes kept (``"200GB"``, ``"50GiB"`` or an int); ``None``: the node's
            free disk decides. Parsed here: a bad size fails at construction.
        storage_options: fsspec options of the store (credentials, endpoint).
        inflight_allowance, retry, prefetch_workers, prefetch_ahead, eviction: the
            :class:`stoker.cache.ShardCache` arguments of the same names; ``None``: its
            defaults.
    """

    dir: str | os.PathLike[str] | None = None
    limit: int | str | None = None
    storage_options: Mapping[str, Any] | None = None
    inflight_allowance: int | str | None = None
    retry: Any = None
    prefetch_workers: int | None = None
    prefetch_ahead: int | None = None
    eviction: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dir", _path(self.dir, "cache dir"))
        try:
            if self.limit is not None:
                object.__setattr__(self, "limit", parse_size(self.limit, "cache limit"))
            if self.inflight_allowance is not None:
                parse_size(self.inflight_allowance, "inflight_allowance")
        except ValueError as e:
            raise OptionsError(str(e)) from None
        if self.storage_options is not None and not isinstance(self.storage_options, Mapping):
            raise OptionsError(f"storage_options={self.storage_options!r} must be a mapping "
                               "of fsspec options, e.g. {'anon': True}.")

    def shard_cache_kwargs(self) -> dict[str, Any]:
        """The ``ShardCache`` keyword arguments set here (``dir``, ``limit`` and
        ``storage_options`` are passed on their own)."""
        names = ("inflight_allowance", "retry", "prefetch_workers", "prefetch_ahead", "eviction")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


@dataclass(frozen=True, slots=True)
class LedgerOptions:
    """The reproducibility ledger ``stoker audit`` checks.

    Attributes:
        path: the ledger file (one per rank: the rank is added to the name when W > 1).
        ids: also record every step's sample ids (the audit replays the order either way).
        content: record each step's content digests (per column, as delivered);
            ``stoker audit --dataset`` recomputes them from the verified shards.
    """

    path: str | os.PathLike[str]
    ids: bool = False
    content: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", _path(self.path, "ledger path"))
        for name in ("ids", "content"):
            if not isinstance(getattr(self, name), bool):
                raise OptionsError(f"LedgerOptions.{name}={getattr(self, name)!r} must be "
                                   "True or False.")


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """Who computes batches, and how the user's code is seeded there.

    Attributes:
        mode: ``"thread"`` or ``"process"`` workers; ``None``: threads for a stoker dataset
            (its reads release the GIL), processes for a torch dataset.
        sample_seeding: seed torch/numpy/random for every dataset call from (seed, epoch,
            sample), so augmentations do not depend on workers, world size or resume;
            ``False``: torch's per-worker seeding only.
        service: ``stoker serve`` URLs (``["grpc://host:port", ...]``) or a
            ``stoker.loader.service.options.Service``: batches come from those servers,
            bitwise equal to local ones (failover and hedging in the service client).
        read_ahead: with ``num_workers=0``, read a stoker dataset's next batches in one
            stoker thread while the caller uses the current one, when no user code runs
            in a batch (no ``collate_fn``, no ``transform``, stoker's own order); the same
            batches in the same order. ``False``: each batch is read in the caller's thread
            when it is asked for, as torch's ``num_workers=0`` does.
    """

    mode: str | None = None
    sample_seeding: bool = True
    service: Any = None
    read_ahead: bool = True

    def __post_init__(self) -> None:
        if self.mode not in WORKER_MODES:
            raise OptionsError(f"worker mode {self.mode!r} is not supported; use 'thread' or "
                               "'process' (or None for the dataset's default).")
        if not isinstance(self.sample_seeding, bool):
            raise OptionsError(f"sample_seeding={self.sample_seeding!r} must be True or False.")
        if not isinstance(self.read_ahead, bool):
            raise OptionsError(f"read_ahead={self.read_ahead!r} must be True or False.")
        if self.service is not None:
            from stoker.loader.service.options import Service

            object.__setattr__(self, "service", Service.of(self.service))
