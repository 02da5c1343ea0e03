"""Compiled steps of a mixture's order: the blend's picks -> mixture ids in two passes, no sort.

A window of the blend names, at each position, a source ``i`` and its pick number ``j``. Source
``i``'s picks in the window fall in ``[lo_i, hi_i)``, which
:meth:`stoker.loader.order.mixture_order.PassOrders.ids` reads as contiguous ranges of the
source's pass orders (one range kernel call per source and pass) into one buffer, source after
source. :func:`pick_spans` finds those bounds and :func:`place` writes every position's id
from the buffer: O(window) each, instead of an argsort of the window by source and a fancy
index per source and pass (what the mixture cost per batch on top of one dataset's order,
bench/mixture_bench.py). :func:`source_of` gives a batch's ``"source"`` column from its ids.
"""

from __future__ import annotations

import numpy as np

from stoker.loader.jit.kernel import gil_kernel, kernel
from stoker.loader.jit.search import last_at_or_below

__all__ = ["pick_spans", "place", "source_of"]


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


@gil_kernel
def source_of(ids, offsets):  # type: ignore[no-untyped-def]
    """int64 source of each mixture id: the last ``i`` with ``offsets[i] <= id`` (``-1`` if
    none), i.e. ``searchsorted(offsets, ids, "right") - 1`` without its temporaries and cast:
    a batch's ``"source"`` column costs one pass over its ids."""
    out = np.empty(ids.shape[0], dtype=np.int64)
    for k in range(ids.shape[0]):
        v = ids[k]
        out[k] = -1 if v < offsets[0] else last_at_or_below(offsets, v, 0, offsets.shape[0])
    return out
