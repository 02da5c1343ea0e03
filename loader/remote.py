"""The loader's side of the node-local cache: open it and hand shards to the reader."""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from typing import Any, Callable, Mapping

from stoker.manifest import Manifest

__all__ = ["open_cache"]


def open_cache(manifest: Manifest, cache_dir: str | os.PathLike[str] | None,
               cache_limit: int | str | None, storage_options: Mapping[str, Any] | None,
               max_open: int) -> tuple[Any, Callable[[int], AbstractContextManager[str]]]:
    """A :class:`stoker.cache.ShardCache` for ``manifest`` and the opener the reader uses.

    The opener pins a shard for as long as the reader keeps it open, so the cache never
    evicts a shard that is being read; ``max_open`` (the reader's open-shard bound) lets the
    cache refuse, at start, a ``cache_limit`` too small to hold that many pinned shards.
    """
    from stoker.cache import ShardCache, default_cache_dir

    cache = ShardCache(manifest, cache_dir if cache_dir is not None else default_cache_dir(),
                       limit=cache_limit, storage_options=storage_options, max_pinned=max_open)
    return cache, cache.pin
