"""The future of each cached source of a mixture: what its shard cache will be asked for.

A single dataset hands its cache every shard use of the rest of the epoch
(:func:`stoker.loader.epoch_iter.cache_clock`): the cache prefetches ahead of the reader and
evicts the shard whose next use is furthest (Belady). A mixture's sources are read through
caches of their own, in the order of their *picks*: source ``i``'s ``j``-th pick is position
``j mod N_i`` of its own pass ``j div N_i``. So a source's future, in pick coordinates, is its
pass orders' shard uses over the picks the rest of the epoch makes of it (the blend's counts
at the epoch's end minus those at the current step), and its clock is its pick count at each
step, kept incrementally from the blend's picks of the steps in between (one blend window per
step, no restart).

All ranks' picks count: a rank's own are a subset that only a walk over its positions could
tell, so the loader sets this future only for a single rank
(:meth:`stoker.loader.read.mixture.MixtureSource.cache_clock`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["mixture_clock"]


def mixture_clock(caches: Sequence[Any], order: Any, plan: Any,
                  step: int) -> Callable[[int], None] | None:
    """Set each cache's future from loader step ``step`` to the epoch's end (``caches[i]``
    is source ``i``'s cache or ``None``); returns ``clock(step)``, which moves every cache's
    cursor to its source's pick count at ``step`` (``None`` when no source has a cache)."""
    if all(c is None for c in caches):
        return None
    blend, base = order.mixture.blend, order.epoch * order.num_samples
    steps = plan.steps_per_epoch
    start = plan.window(step)[0] if step < steps else order.num_samples
    at = base + start
    picks = blend.counts(at)
    end = blend.counts(base + order.num_samples)
    sizes = order.mixture.sizes
    for i, cache in enumerate(caches):
        if cache is not None:
            shards, spans = _uses(order.passes, i, int(sizes[i]), int(picks[i]), int(end[i]))
            cache.set_future(shards, spans)
            cache.advance_to(int(picks[i]))
    state = [at, picks.copy()]

    def clock(s: int) -> None:
        to = base + (plan.window(s)[0] if s < steps else order.num_samples)
        if to <= state[0]:
            return
        src, _ = blend.picks(state[0], to)
        state[0], state[1] = to, state[1] + np.bincount(src, minlength=len(caches))
        for i, cache in enumerate(caches):
            if cache is not None:
                cache.advance_to(int(state[1][i]))
    return clock


def _uses(passes: Any, source: int, size: int, first: int,
          stop: int) -> tuple[np.ndarray, np.ndarray]:
    """Shard uses of picks ``[first, stop)`` of ``source``: ``(shards, [first, last] spans)``
    in pick coordinates, pass after pass."""
    shards, spans = [], []
    for p in range(first // size, -(-stop // size)) if stop > first and size else ():
        lo, hi = max(first - p * size, 0), min(stop - p * size, size)
        s, f, last = passes.get(source, p).shard_uses(lo, hi)
        shards.append(s)
        spans.append(np.stack([f, last], axis=1) + p * size)
    if not shards:
        return np.empty(0, dtype=np.int64), np.empty((0, 2), dtype=np.int64)
    return np.concatenate(shards).astype(np.int64), np.concatenate(spans).astype(np.int64)
