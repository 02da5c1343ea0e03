"""Counters of one :class:`~stoker.cache.ShardCache`: numbers only, never a URL or a secret."""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields

__all__ = ["CacheStats"]


@dataclass(frozen=True, slots=True)
class CacheStats:
    """A snapshot of what one cache object (one process) did since it was opened.

    Attributes:
        hits: shards requested that were already complete on local disk.
        misses: shards requested that had to be downloaded (or waited for) first.
        bytes_fetched: bytes received from remote storage by this process.
        fetches: shard downloads this process completed (prefetches included).
        prefetches: of those, downloads started ahead of need by the prefetch threads.
        evictions: shards this process deleted to stay within the byte budget.
        derived_evictions: record files (derived data in the node cache) this process deleted
            to make room for a shard under the byte budget.
        retries: failed requests that were retried.
        restarts: downloads restarted from byte 0 (server ignored Range, object changed).
        quarantines: downloaded or cached files that failed verification and were set aside
            (a download, start-up repair, or the re-hash of a cached file on open).
        repaired: files removed at start-up because a crash had left them dirty.
        backoff_ms: milliseconds the retries were scheduled to wait (backoff, or the
            server's ``Retry-After``): what the policy chose, not a clock reading.
    """

    hits: int = 0
    misses: int = 0
    bytes_fetched: int = 0
    fetches: int = 0
    prefetches: int = 0
    evictions: int = 0
    derived_evictions: int = 0
    retries: int = 0
    restarts: int = 0
    quarantines: int = 0
    repaired: int = 0
    backoff_ms: int = 0

    @property
    def hit_rate(self) -> float:
        """``hits / (hits + misses)``, or 0.0 before the first request."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class _Counters:
    """Thread-safe mutable counterpart of :class:`CacheStats`."""

    __slots__ = ("_lock", "_values")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = {f.name: 0 for f in fields(CacheStats)}

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._values[name] += amount

    def snapshot(self) -> CacheStats:
        with self._lock:
            return CacheStats(**self._values)
