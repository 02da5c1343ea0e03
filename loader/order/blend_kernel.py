"""The blend's compiled inner loop: earliest-deadline-first over the sources' next picks.

:mod:`stoker.loader.order.blend` explains the rule and proves it; this module only runs it. Each
source ``i`` has one pending pick (its ``x[i]``-th), allowed from slot ``rel[i]`` (its release)
until slot ``nxt[i] - 1`` (its deadline). At every slot the released pick with the earliest
deadline is served (ties: the lower source index), then the source's next pick is computed
with 64-bit integer steps along its target ``N_i(p) = D * T_i(p)``: ``nxt[i]`` is the first
position where ``N_i`` reaches ``(x[i] + 1) * D``, ``exc[i] = N_i(nxt[i]) - (x[i] + 1) * D``
its excess, ``seg[i]`` the schedule segment holding ``nxt[i]``. Rates ``rates[s, i]`` (the
increase of ``N_i`` per position in segment ``s``) are positive and ``D <= 2**62``, so no
product below overflows; ``quot``/``rem`` hold ``D // rates`` and ``D % rates``.

Two binary heaps of source indices: ``ready`` ordered by (deadline, index) holds released
picks, ``waiting`` ordered by (release, index) the others. A slot costs O(log sources).
"""

from __future__ import annotations

import numpy as np

from stoker.loader.jit.kernel import kernel

__all__ = ["FLAT_SOURCES", "run_blend", "run_blend_flat"]

_SCAN_SOURCES = 16  # up to this many sources a linear scan per slot is faster than heaps
# run_blend_flat scans up to this many sources: per position, at random weights, 4.1 against
# 10-11 ns with 3 sources, 22 against 52-62 with 17, 79 against 125-140 (heaps) with 100
FLAT_SOURCES = 128
_FEW = 6  # up to this many sources the flat scan compares through the index (see below)
_NEVER = np.iinfo(np.int64).max  # above every deadline


@kernel
def _less(key, a, b):  # type: ignore[no-untyped-def]
    return key[a] < key[b] or (key[a] == key[b] and a < b)


@kernel
def _push(heap, size, key, item):  # type: ignore[no-untyped-def]
    """Insert ``item`` into ``heap[:size]``; returns the new size."""
    pos = size
    heap[pos] = item
    while pos > 0:
        parent = (pos - 1) >> 1
        if _less(key, heap[pos], heap[parent]):
            heap[pos], heap[parent] = heap[parent], heap[pos]
            pos = parent
        else:
            break
    return size + 1


@kernel
def _pop(heap, size, key):  # type: ignore[no-untyped-def]
    """Remove and return the smallest item of ``heap[:size]`` (the caller decrements size)."""
    top = heap[0]
    size -= 1
    heap[0] = heap[size]
    pos = 0
    while True:
        left = 2 * pos + 1
        if left >= size:
            break
        child = left
        if left + 1 < size and _less(key, heap[left + 1], heap[left]):
            child = left + 1
        if _less(key, heap[child], heap[pos]):
            heap[pos], heap[child] = heap[child], heap[pos]
            pos = child
        else:
            break
    return top


@kernel
def run_blend(start, stop, out_src, out_pick, x, rel, nxt, exc, seg, bounds, rates, quot,
              rem, D):  # type: ignore[no-untyped-def]
    """Serve slots ``[start, stop)``; writes the source and its pick number for each slot.

    The per-source arrays are updated in place to the state at ``stop``. Returns ``-1`` on
    success, or the first slot whose earliest pick was already past its deadline (impossible
    from a feasible state, see stoker.loader.order.blend; the caller raises). One function, with
    the next-pick step written inline: a call per slot into another kernel costs ~4x here.
    """
    n = x.shape[0]
    scan = n <= _SCAN_SOURCES
    ready = np.empty(n, dtype=np.int64)
    waiting = np.empty(n, dtype=np.int64)
    nr = 0
    nw = 0
    if not scan:
        for i in range(n):
            if rel[i] <= start:
                nr = _push(ready, nr, nxt, i)
            else:
                nw = _push(waiting, nw, rel, i)
    for slot in range(start, stop):
        if scan:
            i = -1
            for j in range(n):
                if rel[j] <= slot and (i < 0 or nxt[j] < nxt[i]):
                    i = j
            if i < 0:
                return slot
        else:
            while nw > 0 and rel[waiting[0]] <= slot:
                nr = _push(ready, nr, nxt, _pop(waiting, nw, rel))
                nw -= 1
            if nr == 0:
                return slot
            i = _pop(ready, nr, nxt)
            nr -= 1
        if nxt[i] <= slot:  # deadline nxt[i] - 1 already passed
            return slot
        out_src[slot - start] = i
        out_pick[slot - start] = x[i]
        # the next pick of i: released once N_i exceeds (x[i] + 1) * D, due before N_i
        # reaches (x[i] + 2) * D; N_i(nxt[i]) = (x[i] + 1) * D + exc[i]
        x[i] += 1
        p = nxt[i]
        rel[i] = p - 1 if exc[i] > 0 else p
        need = D - exc[i]
        s = seg[i]
        c = rates[s, i]
        if exc[i] < c:  # need is in (D - c, D]: t = ceil(need / c) without a division
            t = quot[s, i] + (1 if exc[i] < rem[s, i] else 0)
        else:  # nxt[i] opened segment s: the excess came at the previous segment's rate
            t = (need + c - 1) // c
        while t > bounds[s + 1] - p:  # the crossing lies beyond segment s
            need -= (bounds[s + 1] - p) * c
            p = bounds[s + 1]
            s += 1
            c = rates[s, i]
            t = (need + c - 1) // c
        p += t
        exc[i] = t * c - need
        if p == bounds[s + 1]:
            s += 1
        nxt[i] = p
        seg[i] = s
        if not scan:
            if rel[i] <= slot + 1:
                nr = _push(ready, nr, nxt, i)
            else:
                nw = _push(waiting, nw, rel, i)
    return -1


@kernel
def run_blend_flat(start, stop, out_src, out_pick, x, rel, nxt, exc, rates, quot, rem,
                   D):  # type: ignore[no-untyped-def]
    """:func:`run_blend` for a blend of one segment (no schedule) and at most
    :data:`FLAT_SOURCES` sources: the same slots, the same state after them (``seg`` stays
    0), without the segment steps and with a linear scan; ``rates``, ``quot``, ``rem`` are
    the segment's rows. Two forms of the same scan (ties: the lower index): comparing
    through the index measured 2.2-2.5x faster than :func:`run_blend` for 2-5 sources and
    slower from ~17, keeping the best deadline in a local the reverse."""
    n = x.shape[0]
    few = n <= _FEW
    for slot in range(start, stop):
        i = -1
        if few:
            for j in range(n):
                if rel[j] <= slot and (i < 0 or nxt[j] < nxt[i]):
                    i = j
            if i < 0:
                return slot
            best = nxt[i]
        else:
            best = _NEVER
            for j in range(n):
                v = nxt[j]
                if rel[j] <= slot and v < best:
                    best = v
                    i = j
            if i < 0:
                return slot
        if best <= slot:  # deadline best - 1 already passed
            return slot
        out_src[slot - start] = i
        out_pick[slot - start] = x[i]
        x[i] += 1  # the next pick of i, as in run_blend with one segment
        e = exc[i]
        rel[i] = best - 1 if e > 0 else best
        t = quot[i] + (1 if e < rem[i] else 0)
        nxt[i] = best + t
        exc[i] = t * rates[i] - (D - e)
    return -1
