"""The future of each cached source of a mixture: what its shard cache will be asked for.

A single dataset hands its cache every shard use of the rest of the epoch
(:func:`stoker.loader.epoch_iter.cache_clock`): the cache prefetches ahead of the reader and
evicts the shard whose next use is furthest (Belady). A mixture's sources are read through
caches of their own, and which shards of a source a rank reads depends on the blend at the
rank's own positions (``k % world_size == rank``): with weights 1:1 and two ranks, each rank
reads only one of two sources. So the future is computed, per rank, over a window of the
next :data:`AHEAD` global batches: the blend's picks at the rank's positions, each pick's
sample in its source's pass order, the shard holding it; consecutive reads of one shard by
one source make one use, spanning the epoch positions of its first and last read. The clock
moves every cache's cursor to the step's first position and recomputes the window when half
of it has been read. Past the window a shard counts as not needed again (evicted first).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["AHEAD", "mixture_clock"]

#: Global batches of the future each source's cache is told (recomputed at half).
AHEAD = 256


def mixture_clock(caches: Sequence[Any], order: Any, plan: Any,
                  step: int) -> Callable[[int], None] | None:
    """Tell each cache (``caches[i]``: source ``i``'s cache or ``None``) its future from
    loader step ``step`` on; returns ``clock(step)``, which moves every cursor to ``step``'s
    first position and renews the futures as the reader goes (``None``: no source has a
    cache)."""
    if all(c is None for c in caches):
        return None
    steps = plan.steps_per_epoch
    rows = [np.cumsum(m.shard_rows) - m.shard_rows for m in order.mixture.manifests]
    renew = [0]

    def at(s: int) -> int:
        return plan.window(s)[0] if s < steps else order.num_samples

    def tell(s: int) -> None:
        start, stop = at(s), at(min(steps, s + AHEAD))
        for i, (shards, spans) in enumerate(_uses(order, plan, rows, start, stop)):
            if caches[i] is not None:
                caches[i].set_future(shards, spans)
        renew[0] = at(min(steps, s + AHEAD // 2)) if stop < order.num_samples else \
            order.num_samples + 1

    def clock(s: int) -> None:
        position = at(s)
        if position >= renew[0]:
            tell(s)
        for cache in caches:
            if cache is not None:
                cache.advance_to(position)

    tell(step)
    clock(step)
    return clock


def _uses(order: Any, plan: Any, rows: list[np.ndarray], start: int,
          stop: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per source: ``(shards, [first, last] epoch positions)`` of the uses this rank makes in
    positions ``[start, stop)``, in order."""
    n = len(rows)
    empty = (np.empty(0, dtype=np.int64), np.empty((0, 2), dtype=np.int64))
    first = start + (plan.rank - start) % plan.world_size
    if first >= stop:
        return [empty] * n
    src, pick = order.sources(first, stop)
    src, pick = src[::plan.world_size], pick[::plan.world_size]
    position = np.arange(first, stop, plan.world_size, dtype=np.int64)[:len(src)]
    ids = order.passes.ids(src, pick, np.asarray(order.mixture.sizes, dtype=np.int64),
                           order.mixture.offsets)
    out = []
    for i in range(n):
        mine = src == i
        if not mine.any():
            out.append(empty)
            continue
        local = ids[mine] - order.mixture.offsets[i]
        shard = np.searchsorted(rows[i], local, side="right") - 1
        pos = position[mine]
        head = np.flatnonzero(np.r_[True, shard[1:] != shard[:-1]])
        tail = np.r_[head[1:], len(shard)] - 1
        out.append((shard[head].astype(np.int64), np.stack([pos[head], pos[tail]], axis=1)))
    return out
