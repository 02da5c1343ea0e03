"""The loader's side of the node-local cache: open it and hand shards to the reader."""

from __future__ import annotations

import os
import threading
from contextlib import AbstractContextManager
from typing import Any, Callable, Mapping

from stoker.manifest import Manifest

__all__ = ["open_cache", "pin_bound"]


def pin_bound(manifest: Manifest, partitions: int, world_size: int, num_workers: int,
              cache_limit: int | str | None) -> int:
    """How many shards the reader may keep open (each holding a cache pin).

    About two shards per partition this rank owns (its live window) plus one per worker, but
    never more than the budget can pin beside one shard being admitted: the reader then
    closes (unpins) shards beyond its window first.
    """
    owned = -(-partitions // world_size)
    bound = 2 * owned + num_workers + 2
    if cache_limit is not None and manifest.num_shards:
        from stoker.cache import parse_size

        fit = parse_size(cache_limit, "cache limit") // max(1, int(manifest.shard_bytes.max())) - 1
        bound = min(bound, fit)
    return max(1, bound)


def open_cache(manifest: Manifest, cache_dir: str | os.PathLike[str] | None,
               cache_limit: int | str | None, storage_options: Mapping[str, Any] | None,
               max_open: int, cache_options: Mapping[str, Any] | None = None,
               ) -> tuple[Any, Callable[[int], AbstractContextManager[str]]]:
    """A :class:`stoker.cache.ShardCache` for ``manifest`` and the opener the reader uses.

    The opener pins a shard for as long as the reader keeps it open, so the cache never
    evicts a shard that is being read; ``max_open`` (the reader's open-shard bound) lets the
    cache refuse, at start, a ``cache_limit`` too small to hold that many pinned shards.
    ``cache_options`` are further :class:`~stoker.cache.ShardCache` keyword arguments
    (``retry``, ``inflight_allowance``, ``prefetch_workers``, ...).
    """
    from stoker.cache import open_shard_cache

    cache = open_shard_cache(manifest, cache_dir, limit=cache_limit,
                             storage_options=storage_options, max_pinned=max_open,
                             **(cache_options or {}))
    return cache, _Opener(cache)


class _Opener:
    """``cache.pin``, re-opened once in each forked worker process.

    A ShardCache's locks and threads belong to the process that made it, so a worker forked
    from the loader re-opens the same cache directory (what unpickling a ShardCache does)
    the first time it reads a shard.
    """

    def __init__(self, cache: Any) -> None:
        self._cache = cache
        self._pid = os.getpid()
        self._mutex = threading.Lock()

    def __call__(self, index: int) -> AbstractContextManager[str]:
        if os.getpid() != self._pid:
            with self._mutex:
                if os.getpid() != self._pid:
                    rebuild, (manifest, cache_dir, options) = self._cache.__reduce__()
                    # the loader's process prefetches; a worker only pins what it reads
                    self._cache = rebuild(manifest, cache_dir, {**options, "prefetch_workers": 0})
                    self._pid = os.getpid()
        return self._cache.pin(index)

    def derived_budget(self, directory: str) -> Any:
        """The cache's budget for record files saved in ``directory``
        (:meth:`stoker.cache.ShardCache.derived_budget`): a picklable value, or ``None``."""
        return self._cache.derived_budget(directory)

    def __reduce__(self) -> tuple[Any, ...]:  # spawned workers: the cache re-opens itself
        return (_Opener, (self._cache,))
