"""Binary search shared by the compiled kernels (order pieces, shard starts)."""

from __future__ import annotations

import numpy as np

from stoker.loader.jit.kernel import kernel

__all__ = ["bucket_index", "distinct", "find_run", "last_at_or_below"]


@kernel
def last_at_or_below(starts, x, lo, hi):  # type: ignore[no-untyped-def]
    """Index of the last entry of sorted ``starts[lo:hi]`` that is ``<= x`` (``lo`` if none):
    the run (piece, shard) that position ``x`` falls in."""
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if starts[mid] <= x:
            lo = mid
        else:
            hi = mid
    return lo


def distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values of int64 ``values``, ascending: ``np.unique`` without its first
    call's import of ``numpy.ma`` (~10 ms of a fresh process's first batch)."""
    values = np.sort(np.asarray(values, dtype=np.int64))
    return values[np.concatenate(([True], values[1:] != values[:-1]))] if len(values) \
        else values


def bucket_index(starts: np.ndarray) -> tuple[int, np.ndarray]:
    """``(shift, bucket)`` narrowing :func:`find_run`'s search: ``bucket[j]`` is the last run
    (below ``len(starts) - 1``) starting at or before ``j << shift``, so the run holding ``x``
    lies in ``bucket[x >> shift] ..= bucket[(x >> shift) + 1]``; a last entry ``len(starts) -
    2`` covers every ``x`` past the buckets. At most ``2 x len(starts) + 2`` buckets: a
    lookup reads one or two entries instead of ``log2(runs)`` unpredictable branches (a
    staged round has ~1,400 runs: the record gather 250-267 -> 169-227 us per W1 batch of
    1,024 rows)."""
    last = len(starts) - 1
    if last < 1:
        return 0, np.array([0, last - 1], dtype=np.int64)
    top = max(int(starts[last - 1]), 0)
    shift = 0
    while (top >> shift) + 1 > 2 * len(starts):
        shift += 1
    edges = np.arange((top >> shift) + 2, dtype=np.int64) << shift
    bucket = np.searchsorted(starts[:last], edges, side="right") - 1
    return shift, np.append(np.clip(bucket, 0, last - 1), last - 1).astype(np.int64)


@kernel
def find_run(starts, shift, bucket, x):  # type: ignore[no-untyped-def]
    """``last_at_or_below(starts, x, 0, len(starts) - 1)`` through :func:`bucket_index`.

    Branch-free (the last bucket catches ``x`` past the others): with a branch choosing the
    bounds, a kernel calling this once per row paid ~25 ns a call (27 us per 1,024 lookups
    against 1.8 us without the branch, same process; most likely the array arguments'
    reference counting, no longer elided), half the record gather of a natural-order batch."""
    j = min(x >> shift, bucket.shape[0] - 2)
    return last_at_or_below(starts, x, bucket[j], bucket[j + 1] + 1)
