"""Which committed files go first when the budget needs room: Belady's order, or LRU's.

Belady: the unpinned shard whose next use (in the future sequence given by
:meth:`~stoker.cache.ShardCache.set_future`) is furthest away goes first; shards never needed
again go before any others. Prefetching ahead of need only ever evicts shards needed *later*
than the one it fetches, so it never makes the optimal schedule worse. LRU is there for
comparison. Quarantined copies always go first.
"""

from __future__ import annotations

import math
from typing import Container, Mapping

from stoker.cache.store.budget import CommittedFile
from stoker.cache.store.future import FutureIndex

__all__ = ["POLICIES", "rank_victims"]

POLICIES = ("belady", "lru")


def rank_victims(i: int, files: list[CommittedFile], prefetch: bool, *, policy: str,
                 pinned: Container[int], last_used: Mapping[int, int],
                 future: FutureIndex | None) -> list[CommittedFile]:
    """Eviction candidates for admitting ``i``, best first: quarantined copies, then by policy.

    Belady: furthest next use first (never again = infinity), least recently used among
    equals; a prefetch may only evict shards needed later than ``i``. LRU: least recently
    used first; a prefetch evicts nothing but quarantined copies. ``pinned`` shards and ``i``
    itself are never candidates. ``last_used`` holds each shard's last read on the cache's
    clock; the caller holds the lock that guards it, ``pinned`` and ``future``.
    """
    quarantined = [f for f in files if f[0] is None]
    shards = [f for f in files if f[0] is not None and f[0] != i and f[0] not in pinned]
    if policy == "lru":
        if prefetch:
            return quarantined
        shards.sort(key=lambda f: last_used.get(f[0], 0))  # type: ignore[arg-type]
        return quarantined + shards
    nxt = {f[0]: future.next_use(f[0]) if future is not None else math.inf  # type: ignore[arg-type]
           for f in shards}
    mine = future.next_use(i) if future is not None else math.inf
    if prefetch:
        shards = [f for f in shards if nxt[f[0]] > mine]
    # Furthest next use first; among equals (e.g. never needed again), least recent,
    # except among shards in use right now (a timed future cannot tell which is read
    # next): most recent first, which keeps a fixed subset under a budget smaller than
    # the working set instead of cycling through all of them (LRU's worst case).
    now = future.cursor if future is not None and future.timed else None

    def rank(f: CommittedFile) -> tuple[float, int]:
        used = last_used.get(f[0], 0)  # type: ignore[arg-type]
        return -nxt[f[0]], (-used if nxt[f[0]] == now else used)  # type: ignore[index]

    shards.sort(key=rank)
    return quarantined + shards
