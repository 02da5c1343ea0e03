"""Compiled steps of a mixture's order: the blend's picks -> mixture ids in two passes, no sort.

A window of the blend names, at each position, a source ``i`` and its pick number ``j``. Source
``i``'s picks in the window fall in ``[lo_i, hi_i)``, which
:meth:`stoker.loader.order.mixture_order.PassOrders.ids` reads as contiguous ranges of the
source's pass orders (one range kernel call per source and pass) into one buffer, source after
source. :func:`pick_spans` finds those bounds and :func:`place` writes every position's id
from the buffer: O(window) each, instead of an argsort of the window by source and a fancy
index per source and pass (what the mixture cost per batch on top of one dataset's order,
bench/mixture_bench.py).
"""

from __future__ import annotations

import numpy as np

from stoker.loader.jit.kernel import kernel

__all__ = ["pick_spans", "place"]


@kernel
def pick_spans(src, pick, n):  # type: ignore[no-untyped-def]
    """int64 ``(lo, hi)``: the smallest pick and one past the largest pick of each of the
    ``n`` sources among ``(src, pick)``, in any order; ``lo == hi == 0`` for a source absent."""
    lo = np.zeros(n, dtype=np.int64)
    hi = np.zeros(n, dtype=np.int64)
    for k in range(src.shape[0]):
        i = src[k]
        j = pick[k]
        if lo[i] == hi[i]:  # first pick of source i (a present source has hi > lo)
            lo[i] = j
            hi[i] = j + 1
        elif j < lo[i]:
            lo[i] = j
        elif j >= hi[i]:
            hi[i] = j + 1
    return lo, hi


@kernel
def place(src, pick, lo, base, buf, offsets):  # type: ignore[no-untyped-def]
    """int64 mixture ids: position ``k`` gets ``buf[base[i] + pick[k] - lo[i]] + offsets[i]``
    with ``i = src[k]`` (``buf[base[i]:]`` holds source ``i``'s order from pick ``lo[i]`` on)."""
    out = np.empty(src.shape[0], dtype=np.int64)
    for k in range(src.shape[0]):
        i = src[k]
        out[k] = buf[base[i] + pick[k] - lo[i]] + offsets[i]
    return out
