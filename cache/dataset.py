"""Opening a dataset's cache: where it lives by default, the :class:`ShardCache` for a
manifest, and ``open_dataset`` (a manifest and, when its shards need one, that cache)."""

from __future__ import annotations

import os
from typing import Any, Mapping

from stoker.cache.store.shard_cache import ShardCache
from stoker.manifest import Manifest, is_url, locations

__all__ = ["default_cache_dir", "open_dataset", "open_shard_cache"]


def default_cache_dir() -> str:
    """``$STOKER_CACHE_DIR``, else ``$XDG_CACHE_HOME/stoker``, else ``~/.cache/stoker``
    (:func:`stoker.manifest.locations.cache_dir`, where every default location is resolved)."""
    return locations.cache_dir()


def open_shard_cache(manifest: Manifest, cache_dir: str | os.PathLike[str] | None = None,
                     **options: Any) -> ShardCache:
    """The :class:`ShardCache` of ``manifest`` in ``cache_dir`` (default
    :func:`default_cache_dir`); ``options`` are its keyword arguments (``limit``, ...)."""
    return ShardCache(manifest, locations.cache_dir(cache_dir),
                      **options)


def open_dataset(location: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None,
                 storage_options: Mapping[str, Any] | None = None,
                 **cache_options: Any) -> tuple[Manifest, ShardCache | None]:
    """Load and validate the manifest at ``location``; open a cache if the shards need one.

    A local, uncompressed dataset is read in place (no cache, ``None``) unless ``cache_dir``
    is given. Remote datasets (``s3://``, ``gs://``, ``http(s)://``) and zstd-compressed ones
    get a :class:`ShardCache` in ``cache_dir`` (default :func:`default_cache_dir`).

    Args:
        location: dataset directory, ``manifest.json`` path or URL.
        cache_dir: where to keep local copies.
        storage_options: fsspec / HTTP options (credentials); never logged.
        **cache_options: passed to :class:`ShardCache` (``limit``, ``retry``, ...).
    """
    loc = os.fspath(location)
    manifest = Manifest.load(loc, storage_options)
    local = not is_url(loc) or loc.startswith("file://")
    if local and manifest.compression == "none" and cache_dir is None:
        return manifest, None
    return manifest, open_shard_cache(manifest, cache_dir, storage_options=storage_options,
                                      **cache_options)
