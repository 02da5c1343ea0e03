"""The blend of a mixture: which source serves position ``k`` of the stream, exactly.

**Targets.** Sources ``0..n-1`` have positive weights, normalised to sum 1 in each segment of
a piecewise-constant schedule (segment ``s`` covers positions ``[b_s, b_{s+1})``). The target
of source ``i`` after ``k`` positions is ``T_i(k)``, the integral of its weight over ``[0, k)``;
``sum_i T_i(k) = k``. Weights are exact rationals (a float is taken at its exact binary value):
with ``D`` the common denominator, ``N_i(k) = D * T_i(k)`` is an integer that grows by the
*rate* ``c_{s,i} >= 1`` per position of segment ``s``. When ``D`` would exceed ``2**62`` every
segment's weights are rounded once, to multiples of ``2**-61`` summing to 1 (largest
remainders); :attr:`Blend.weights` always gives the exact values the guarantee refers to.

**Guarantee.** ``count_i(k)``, the picks of source ``i`` among positions ``[0, k)``, is
``floor(T_i(k))`` or ``ceil(T_i(k))`` for every ``k`` and ``i``: every prefix is within one
sample of its target, at any ``k`` (integer arithmetic, no drift).

**Rule** (``stoker.blend/1``). Pick ``j`` of source ``i`` (its ``j``-th, from 0) is a unit
job that may be served at slots ``[r, d]`` with ``r = min{p : T_i(p+1) > j}`` (earlier would
put ``count_i(p+1)`` above ``ceil T_i(p+1)``) and ``d = max{p : T_i(p) < j+1}`` (later would
leave ``count_i(d+1)`` below ``floor T_i(d+1)``). Slot ``p`` serves, among the released
pending picks, the one with the earliest deadline (ties: lower source index): EDF.

*Proof of the guarantee.* EDF serves unit jobs with integer windows on one machine without a
miss whenever any schedule can (the exchange argument), and one can iff every interval
``[s, e]`` holds at most ``e - s + 1`` windows (Hall). Source ``i`` has
``(floor T_i(e+1) - ceil T_i(s))_+`` windows inside ``[s, e]``; writing ``f_i(x)`` for the
fractional part of ``T_i(x)``, ``sum_i T_i(x) = x`` makes the sum over ``i`` equal to
``(e - s + 1) - sum_i f_i(e+1) - sum_{i: f_i(s) > 0} (1 - f_i(s)) + m``, where ``m`` counts the
sources with ``f_i(s) > 0`` that do not reach an integer in ``(T_i(s), T_i(e+1)]``. Each such
source has ``f_i(e+1) > f_i(s)``, so it contributes more than 1 to the two subtracted sums:
the count is at most ``e - s + 1``. Every pick is served inside its window, which is the
guarantee.

*Random access.* Let two EDF runs start at slot ``a`` from feasible states (states after
``a`` slots of some valid stream; they differ only in which released picks with deadlines
``>= a`` are done). Let ``X1`` (``X2``) be the picks done by run 2 (1) but pending in run 1
(2); ``|X1| = |X2|``. At a slot either both runs serve the same pick, or one serves an ``X``
pick and the other the same pick or a common pending pick ``c``; ``c`` then joins an ``X`` set,
and ``c`` was preferred over every member of the other ``X`` set, so its deadline is at most the
largest deadline already in ``X1 + X2``. That largest deadline never grows, and every ``X`` pick
is served by its deadline, so the runs agree from slot ``max deadline + 1`` on. Started at
``a = k - G`` (``G = max ceil(D / c_{s,i})``, the longest gap between a source's integer
crossings) from the state that has done the ``d(a) = a - sum_i floor T_i(a)`` released picks
with the earliest deadlines (feasible whenever any state is: it leaves the fewest urgent picks
pending), EDF reproduces the stream of the run from slot 0 at every slot ``>= k``.

**Cost.** Memory O(sources x segments). A window of ``L`` consecutive positions costs
O((G + L) log sources) (plus O(sources) exact integer work to restart); consecutive windows
continue from a cached state at O(log sources) per position. ``G`` is about the inverse of the
smallest weight: O(sources) for balanced weights.
"""

from __future__ import annotations

import bisect
import math
import threading
from fractions import Fraction
from typing import Any, Sequence

import numpy as np

from stoker.loader.order.blend_kernel import FLAT_SOURCES, run_blend, run_blend_flat
from stoker.manifest import StokerError

__all__ = ["BLEND_ALGORITHM", "Blend", "BlendError", "exact_weight"]

BLEND_ALGORITHM = "stoker.blend/1"
_MAX_D = 2**62
_ROUNDED_D = 2**61
_MAX_POSITION = 2**62


class BlendError(StokerError, ValueError):
    """Weights or a schedule the blend cannot use, or a position out of range."""


def exact_weight(value: Any, where: str) -> Fraction:
    """``value`` as an exact positive rational (a float at its exact binary value)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction, np.integer,
                                                         np.floating)):
        raise BlendError(f"{where}: weight {value!r} ({type(value).__name__}) is not a number; "
                         "pass a positive int or float.")
    if isinstance(value, (float, np.floating)) and not math.isfinite(float(value)):
        raise BlendError(f"{where}: weight {value!r} is not finite; pass a positive number.")
    exact = Fraction(value.item() if isinstance(value, np.generic) else value)
    if exact <= 0:
        raise BlendError(f"{where}: weight {value!r} must be > 0 (a source with weight 0 "
                         "would never be read); drop the source from the mixture instead.")
    return exact


def _rates(segments: list[list[Fraction]]) -> tuple[int, list[list[int]], bool]:
    """Common denominator ``D`` and integer rates per segment; exact unless ``D > 2**62``."""
    D = 1
    for w in (w for seg in segments for w in seg):
        D = math.lcm(D, w.denominator)
        if D > _MAX_D:
            break
    else:
        return D, [[int(w * D) for w in seg] for seg in segments], True
    D = _ROUNDED_D
    out = []
    for seg in segments:
        scaled = [w * D for w in seg]
        rates = [math.floor(v) for v in scaled]
        order = sorted(range(len(seg)), key=lambda i: (-(scaled[i] - rates[i]), i))
        for i in order[:D - sum(rates)]:
            rates[i] += 1
        if min(rates) < 1:
            raise BlendError(f"a weight is below 2**-61 of its segment's total ({min(seg)}); "
                             "use weights within 2**60 of each other.")
        out.append(rates)
    return D, out, False


class Blend:
    """Position ``k`` -> (source, pick number): the rule in the module docstring.

    Args:
        segments: ``[(start, weights), ...]``: the first start is 0, starts increase, each
            ``weights`` is a sequence of ``n`` positive numbers (normalised per segment).

    Attributes:
        n: number of sources.
        starts: segment starts.
        weights: exact normalised weights per segment (what the guarantee refers to).
        exact: whether ``weights`` equal the given ones exactly (see the module docstring).
        horizon: ``G``, the restart distance of random access.
    """

    def __init__(self, segments: Sequence[tuple[int, Sequence[Any]]]) -> None:
        if not segments:
            raise BlendError("a blend needs at least one segment of weights")
        starts = [int(s) for s, _ in segments]
        if starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:])):
            raise BlendError(f"segment starts must begin at 0 and increase, got {starts}")
        n = len(segments[0][1])
        if n < 1 or any(len(w) != n for _, w in segments):
            raise BlendError("every segment needs one weight per source")
        fracs = [[exact_weight(w, f"segment at {s}") for w in ws] for s, ws in segments]
        fracs = [[w / total for w in seg] for seg, total in ((seg, sum(seg)) for seg in fracs)]
        self.n = n
        self.starts = tuple(starts)
        self.D, rates, self.exact = _rates(fracs)
        self.weights = tuple(tuple(Fraction(c, self.D) for c in seg) for seg in rates)
        self._rates = np.array(rates, dtype=np.int64).reshape(len(starts), n)
        self._quot, self._rem = self._rates.copy(), self._rates.copy()
        np.divmod(self.D, self._rates, out=(self._quot, self._rem))
        self._bounds = np.array(starts + [np.iinfo(np.int64).max], dtype=np.int64)
        self._ncum = [[0] * n]  # N_i at each segment start, exact
        for s in range(1, len(starts)):
            span = starts[s] - starts[s - 1]
            self._ncum.append([a + span * c for a, c in zip(self._ncum[-1], rates[s - 1])])
        self._ncol = [[row[i] for row in self._ncum] for i in range(n)]
        self.horizon = max(-(-self.D // c) for seg in rates for c in seg)
        self._flat = None if len(starts) > 1 or n > FLAT_SOURCES else \
            tuple(np.ascontiguousarray(a[0]) for a in (self._rates, self._quot, self._rem))
        self._lock = threading.Lock()
        self._cursor: tuple[int, tuple[np.ndarray, ...]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_cursor")}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._cursor = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-plain description: algorithm, exactness and the exact weights as strings."""
        return {"algorithm": BLEND_ALGORITHM, "exact": self.exact,
                "segments": [[s, [str(w) for w in ws]] for s, ws in zip(self.starts, self.weights)]}

    # -- exact targets -------------------------------------------------------------------------
    def _n(self, i: int, p: int) -> int:
        s = bisect.bisect_right(self.starts, p) - 1
        return self._ncum[s][i] + (p - self.starts[s]) * int(self._rates[s, i])

    def target(self, k: int) -> list[Fraction]:
        """``T_i(k)`` for every source, exact."""
        k = self._check(k)
        return [Fraction(self._n(i, k), self.D) for i in range(self.n)]

    def _theta(self, i: int, y: int) -> int:
        """First position where ``N_i`` reaches ``y * D``."""
        goal = y * self.D
        if goal <= 0:
            return 0
        s = bisect.bisect_left(self._ncol[i], goal) - 1
        return self.starts[s] - (-(goal - self._ncol[i][s]) // int(self._rates[s, i]))

    # -- the stream ----------------------------------------------------------------------------
    def _check(self, k: Any) -> int:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) \
                or not 0 <= k <= _MAX_POSITION:
            raise BlendError(f"position {k!r} must be an int in [0, 2**62]")
        return int(k)

    def _restart(self, a: int) -> tuple[np.ndarray, ...]:
        """The kernel state at ``a`` that has done the earliest-deadline released picks."""
        n, D = self.n, self.D
        N = [self._n(i, a) for i in range(n)]
        x = [v // D for v in N]
        due = sorted((self._theta(i, x[i] + 1), i) for i in range(n) if N[i] % D)
        for _, i in due[:a - sum(x)]:
            x[i] += 1
        state = [np.array(x, dtype=np.int64)] + [np.empty(n, dtype=np.int64) for _ in range(4)]
        _, rel, nxt, exc, seg = state
        for i in range(n):
            first = self._theta(i, x[i])  # release of pick x[i]: N_i passes x[i] * D
            rel[i] = first - 1 if self._n(i, first) > x[i] * D else first
            nxt[i] = self._theta(i, x[i] + 1)
            exc[i] = self._n(i, int(nxt[i])) - (x[i] + 1) * D
            seg[i] = bisect.bisect_right(self.starts, int(nxt[i])) - 1
        return tuple(state)

    def _run(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source, pick) of positions ``[start, stop)`` and the counts at ``stop``."""
        with self._lock:
            cursor = self._cursor
            if cursor is not None and cursor[0] <= start <= cursor[0] + self.horizon:
                a, state = cursor[0], tuple(v.copy() for v in cursor[1])
            else:
                a = max(0, start - self.horizon)
                state = self._restart(a)
        src = np.empty(stop - a, dtype=np.int64)
        pick = np.empty(stop - a, dtype=np.int64)
        if self._flat is not None:  # one segment: the same slots without segment steps
            bad = run_blend_flat(np.int64(a), np.int64(stop), src, pick, *state[:4],
                                 *self._flat, np.int64(self.D))
        else:
            bad = run_blend(np.int64(a), np.int64(stop), src, pick, *state, self._bounds,
                            self._rates, self._quot, self._rem, np.int64(self.D))
        if bad >= 0:
            raise BlendError(f"blend invariant broken at position {bad} (a pick past its "
                             "window); this is a bug in stoker.loader.order.blend, please report it")
        with self._lock:
            self._cursor = (stop, state)
        return src[start - a:], pick[start - a:], state[0].copy()

    def picks(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """int64 ``(source, pick)`` of positions ``[start, stop)``: position ``k`` is the
        ``pick[k - start]``-th pick (from 0) of source ``source[k - start]``."""
        start, stop = self._check(start), self._check(stop)
        if stop < start:
            raise BlendError(f"positions [start, stop) = [{start}, {stop}) must not be reversed")
        src, pick, _ = self._run(start, stop)
        return src, pick

    def counts(self, k: int) -> np.ndarray:
        """int64 picks of each source among positions ``[0, k)``."""
        k = self._check(k)
        return self._run(k, k)[2]
