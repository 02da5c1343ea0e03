"""Open-time checks of a cache's byte limits against the dataset's largest shards.

A limit that cannot hold the largest shard, or the shards the reader pins at once plus the one
being admitted, and an in-flight allowance that cannot hold one download, would fail only
mid-epoch; :func:`check_limits` fails them when the cache opens instead, and sizes the default
in-flight allowance.
"""

from __future__ import annotations

import numpy as np

from stoker.cache.errors import CacheLimitError
from stoker.manifest import Manifest, parse_size

__all__ = ["check_limits"]

# In-flight footprint of a zstd shard relative to its stored size: the compressed download
# plus the uncompressed rewrite, assuming at most 4:1 compression.
_ZSTD_FOOTPRINT = 5


def check_limits(manifest: Manifest, limit: int | None, inflight_allowance: int | str | None,
                 max_pinned: int) -> int:
    """The in-flight allowance in bytes, once ``limit`` and it are known to be big enough.

    Default allowance: twice the largest shard (ten times for zstd datasets).

    Raises:
        CacheLimitError: ``limit`` cannot hold the largest shard (or ``max_pinned`` of the
            largest plus one), or ``inflight_allowance`` cannot hold the largest shard.
        ValueError: ``inflight_allowance`` is not a byte size.
    """
    zstd = manifest.compression == "zstd"
    sizes = manifest.shard_bytes
    largest = int(sizes.max()) if sizes.size else 0
    big = int(sizes.argmax()) if sizes.size else 0
    if limit is not None and limit < largest:
        raise CacheLimitError(
            f"cache limit {_human(limit)} ({limit} bytes) cannot hold shard {big} "
            f"({manifest.shards[big].path!r}, {largest} bytes), so no progress is "
            f"possible. Raise the cache limit (CacheOptions(limit=...), --cache-limit) to at "
            f"least {largest} bytes; several times that leaves room for prefetching and for "
            "the shards the loader pins at once.")
    if limit is not None and max_pinned > 1:
        k = min(max_pinned + 1, int(sizes.size))
        need = int(np.sort(sizes)[-k:].sum())
        if limit < need:
            raise CacheLimitError(
                f"cache limit {_human(limit)} ({limit} bytes) cannot hold the "
                f"{max_pinned} shards the reader keeps open at once plus the one it admits "
                f"next ({need} bytes for the largest {k}). Raise the cache limit "
                f"(CacheOptions(limit=...), --cache-limit) to at least {need} bytes, or keep "
                "fewer shards open.")
    if inflight_allowance is None:
        return 2 * largest * (_ZSTD_FOOTPRINT if zstd else 1)
    allowance = parse_size(inflight_allowance, "inflight_allowance")
    if allowance < largest:
        raise CacheLimitError(
            f"inflight_allowance {allowance} bytes cannot hold one download of shard {big} "
            f"({largest} bytes). Raise it to at least {largest} bytes, or leave it unset "
            "for the default (twice the largest shard).")
    return allowance


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"
