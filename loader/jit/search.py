"""Binary search shared by the compiled kernels (order pieces, shard starts)."""

from __future__ import annotations

from stoker.loader.jit.kernel import kernel

__all__ = ["last_at_or_below"]


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
