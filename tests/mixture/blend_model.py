"""The blend rule written the slow, obvious way, and an exact checker of its guarantee.

:func:`naive_blend` follows the docstring of ``stoker.loader.order.blend`` with Python Fractions:
every pick's window from the exact targets, earliest deadline first, one slot at a time. The
compiled kernel must agree with it bit for bit. :func:`quota_violations` checks the guarantee
(every prefix within one sample of its target) with exact integers over a whole stream.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Sequence

import numpy as np


def targets(segments: Sequence[tuple[int, Sequence[Fraction]]], k: int) -> list[Fraction]:
    """T_i(k): the integral of the (already normalised) weights over positions [0, k)."""
    n = len(segments[0][1])
    out = [Fraction(0)] * n
    for s, (start, ws) in enumerate(segments):
        stop = segments[s + 1][0] if s + 1 < len(segments) else None
        span = max(0, min(k, stop) - start) if stop is not None else max(0, k - start)
        out = [t + span * w for t, w in zip(out, ws)]
    return out


def naive_blend(segments: Sequence[tuple[int, Sequence[Fraction]]], stop: int) -> list[int]:
    """Sources of positions [0, stop) by EDF over the picks' windows (see blend.py)."""
    n = len(segments[0][1])
    x = [0] * n

    def window(i: int, j: int, r: int) -> tuple[int, int]:
        """[release, deadline] of pick j, searching from slot r (windows only move on)."""
        while targets(segments, r + 1)[i] <= j:
            r += 1
        d = r
        while targets(segments, d + 1)[i] < j + 1:
            d += 1
        return r, d

    wins = [window(i, 0, 0) for i in range(n)]
    out = []
    for slot in range(stop):
        ready = [(wins[i][1], i) for i in range(n) if wins[i][0] <= slot]
        d, i = min(ready)
        assert d >= slot, f"missed deadline at {slot}"
        out.append(i)
        x[i] += 1
        wins[i] = window(i, x[i], wins[i][0])
    return out


def quota_violations(src: np.ndarray, rates: np.ndarray, starts: Sequence[int], D: int,
                     first: int = 0, counts0: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """(position, source) where the prefix count leaves (floor T, ceil T), exactly.

    ``src`` are the sources of positions ``[first, first + len(src))``; ``counts0`` the
    counts before ``first``. ``T_i(k) * D`` is computed with Python integers (object arrays).
    """
    n = rates.shape[1]
    k = np.arange(first + 1, first + len(src) + 1, dtype=object)
    onehot = np.zeros((len(src), n), dtype=np.int64)
    onehot[np.arange(len(src)), src] = 1
    counts = np.cumsum(onehot, axis=0).astype(object) + np.array(
        counts0 if counts0 is not None else [0] * n, dtype=object)
    bad = []
    for i in range(n):
        N = np.zeros(len(src), dtype=object)
        for s, b in enumerate(starts):
            e = starts[s + 1] if s + 1 < len(starts) else None
            span = np.minimum(k, e) - b if e is not None else k - b
            span = np.where(span > 0, span, 0)
            N = N + span * int(rates[s, i])
        diff = counts[:, i] * D - N
        out = np.flatnonzero((diff <= -D) | (diff >= D))
        bad += [(first + int(p), i) for p in out[:5]]
    return bad


def floor_ceil(t: Fraction) -> tuple[int, int]:
    return math.floor(t), math.ceil(t)
