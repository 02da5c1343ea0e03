"""The blend rule: every prefix within one sample of its target, exact random access, any k."""

from __future__ import annotations

import math
import random
import tracemalloc
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blend_model import naive_blend, quota_violations, targets
from stoker.loader.order.blend import Blend, BlendError

PROPS = settings(max_examples=40, deadline=None)
SQRT7 = [math.sqrt(i) for i in range(2, 9)]  # the Grain comparison: 7 irrational weights

weights = st.lists(st.one_of(st.floats(1e-3, 1e3), st.integers(1, 1000)), min_size=1,
                   max_size=9)


near = st.lists(st.one_of(st.floats(0.1, 10), st.integers(1, 30)), min_size=1, max_size=7)


@st.composite
def segments(draw: st.DrawFn, first: st.SearchStrategy = weights,
             later: st.SearchStrategy = st.floats(1e-3, 1e3)) -> list[tuple[int, list[float]]]:
    ws = draw(first)
    out = [(0, ws)]
    for _ in range(draw(st.integers(0, 3))):
        out.append((out[-1][0] + draw(st.integers(1, 400)),
                    draw(st.lists(later, min_size=len(ws), max_size=len(ws)))))
    return out


def _sequential(blend: Blend, stop: int) -> tuple[np.ndarray, np.ndarray]:
    return Blend(list(zip(blend.starts, blend.weights))).picks(0, stop)


def _check(blend: Blend, src: np.ndarray, first: int = 0, counts0=None) -> None:
    assert quota_violations(src, blend._rates, blend.starts, blend.D, first, counts0) == []


@pytest.mark.parametrize("ws", [[math.sqrt(2), math.sqrt(3)], [math.pi, math.e, math.sqrt(5)],
                                SQRT7], ids=["2", "3", "7"])
def test_every_prefix_of_100k_positions_is_within_one_sample(ws: list[float]) -> None:
    blend = Blend([(0, ws)])
    assert blend.exact  # the floats' exact values, not a rounding of them
    src, pick = blend.picks(0, 120_000)
    _check(blend, src)
    for i in range(len(ws)):  # pick numbers count each source's picks in order
        assert pick[src == i].tolist() == list(range(int((src == i).sum())))


@pytest.mark.parametrize("n", [2, 3, 7])
def test_every_prefix_is_within_one_sample_of_the_scheduled_integral(n: int) -> None:
    rng = random.Random(n)
    segs = [(0, SQRT7[:n])] + [(b, [rng.uniform(0.01, 5) for _ in range(n)])
                               for b in (7_919, 40_000, 77_777)]
    blend = Blend(segs)
    src, _ = blend.picks(0, 110_000)
    _check(blend, src)
    # the weights change at 40_000: the realised shares follow the schedule
    share = np.bincount(src[60_000:77_777], minlength=n) / (77_777 - 60_000)
    expect = np.array([float(w) for w in blend.weights[2]])
    assert np.abs(share - expect).max() < 1e-3


def test_the_checker_sees_a_one_sample_perturbation() -> None:
    blend = Blend([(0, [1, 1])])  # targets k/2: the stream must alternate
    src, _ = blend.picks(0, 100)
    bad = src.copy()
    bad[9], bad[10] = bad[10], bad[9]  # swap one adjacent pair: prefix 10 is off by one
    assert quota_violations(bad, blend._rates, blend.starts, blend.D) != []


@PROPS
@given(segs=segments(near, st.floats(0.1, 10)))  # the model walks windows slot by slot
def test_kernel_equals_the_written_rule(segs: list[tuple[int, list[float]]]) -> None:
    blend = Blend(segs)
    stop = 400
    src, _ = blend.picks(0, stop)
    exact = [(s, list(ws)) for s, ws in zip(blend.starts, blend.weights)]
    assert src.tolist() == naive_blend(exact, stop)


@PROPS
@given(ws=st.lists(st.one_of(st.floats(1e-3, 1e3), st.integers(1, 1000)), min_size=1,
                   max_size=40), data=st.data())
def test_a_blend_without_a_schedule_runs_the_flat_kernel_with_the_same_stream(
        ws: list[float], data: st.DataObject) -> None:
    """One segment runs ``run_blend_flat``; the same weights again from a later position are
    the same targets, run by ``run_blend`` with its segment steps: every slot and every
    restart must agree (both forms of the flat scan: up to 6 sources and more)."""
    flat, general = Blend([(0, ws)]), Blend([(0, ws), (1_000, ws)])
    assert flat._flat is not None and general._flat is None
    a = data.draw(st.integers(0, 5_000))
    for blend in (flat, general):  # a restart at a, then the cursor on to 6_000
        blend.picks(a, a)
    got = [b.picks(a, 6_000) for b in (flat, general)]
    assert got[0][0].tolist() == got[1][0].tolist() and got[0][1].tolist() == got[1][1].tolist()
    assert flat.counts(6_000).tolist() == general.counts(6_000).tolist()


@PROPS
@given(segs=segments(), data=st.data())
def test_random_access_equals_the_sequential_stream(segs, data: st.DataObject) -> None:
    blend = Blend(segs)
    src, pick = blend.picks(0, 3_000)
    _check(blend, src)
    for _ in range(4):
        a = data.draw(st.integers(0, 2_999))
        b = data.draw(st.integers(a, 3_000))
        fresh = Blend(segs)  # no cached cursor: a true restart
        s2, p2 = fresh.picks(a, b)
        assert s2.tolist() == src[a:b].tolist() and p2.tolist() == pick[a:b].tolist()
        assert fresh.counts(b).tolist() == np.bincount(src[:b], minlength=blend.n).tolist()


@pytest.mark.parametrize("ws", [SQRT7, [1, 2], [0.7, 0.2, 0.1], [5, 1e-3, 1, 1]])
def test_random_positions_near_ten_to_the_ten(ws) -> None:
    blend = Blend([(0, ws)])
    rng = random.Random(17)
    for _ in range(12):
        k = 10**10 + rng.randrange(10**9)
        counts = Blend([(0, ws)]).counts(k)
        for c, t in zip(counts.tolist(), targets(list(zip(blend.starts, blend.weights)), k)):
            assert math.floor(t) <= c <= math.ceil(t)
        src, pick = blend.picks(k, k + 4_000)
        _check(blend, src, k, counts)
        for i in range(blend.n):  # picks continue exactly where the counts at k stopped
            mine = pick[src == i]
            assert mine.tolist() == list(range(int(counts[i]), int(counts[i]) + len(mine)))


def test_a_schedule_far_out_is_exact() -> None:
    segs = [(0, SQRT7), (3 * 10**10, SQRT7[::-1]), (3 * 10**10 + 5_000, [1] * 7)]
    blend = Blend(segs)
    k = 3 * 10**10 - 2_000
    counts = blend.counts(k)
    src, _ = blend.picks(k, k + 9_000)  # crosses both segment starts
    _check(blend, src, k, counts)


def test_integer_weights_are_exact_forever() -> None:
    blend = Blend([(0, [1, 2])])
    assert blend.weights == ((Fraction(1, 3), Fraction(2, 3)),) and blend.exact
    assert blend.counts(3 * 10**12).tolist() == [10**12, 2 * 10**12]
    src, _ = blend.picks(3 * 10**12, 3 * 10**12 + 30)
    assert np.bincount(src, minlength=2).tolist() == [10, 20]


def test_weights_too_far_apart_are_rounded_once_and_said_so() -> None:
    blend = Blend([(0, [1.0, 1e-15, 3.0])])
    assert not blend.exact
    assert sum(blend.weights[0]) == 1 and all(w > 0 for w in blend.weights[0])
    assert abs(float(blend.weights[0][1]) - 1e-15 / 4) < 1e-17
    src, _ = blend.picks(0, 5_000)
    _check(blend, src)


def test_one_source_is_the_identity() -> None:
    src, pick = Blend([(0, [3.5])]).picks(10**11, 10**11 + 5)
    assert src.tolist() == [0] * 5 and pick.tolist() == list(range(10**11, 10**11 + 5))


def test_blend_state_for_a_thousand_sources_stays_small() -> None:
    rng = random.Random(3)
    tracemalloc.start()
    blend = Blend([(0, [rng.uniform(0.5, 2) for _ in range(1000)])])
    blend.picks(10**10, 10**10 + 1024)
    blend.picks(10**10 + 1024, 10**10 + 2048)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 10 * 2**20


@pytest.mark.parametrize("ws, words", [
    ([1, 0], "must be > 0"), ([1, -2], "must be > 0"), ([1, float("nan")], "not finite"),
    ([1, float("inf")], "not finite"), ([1, "2"], "not a number"), ([True], "not a number"),
])
def test_bad_weights_are_refused(ws, words: str) -> None:
    with pytest.raises(BlendError, match=words):
        Blend([(0, ws)])


@pytest.mark.parametrize("segs, words", [
    ([(0, [1, 1]), (10, [1, 2]), (10, [2, 1])], "increase"),
    ([(5, [1, 1])], "begin at 0"),
    ([(0, [1, 1]), (10, [1])], "one weight per source"),
    ([], "at least one segment"),
])
def test_bad_segments_are_refused(segs, words: str) -> None:
    with pytest.raises(BlendError, match=words):
        Blend(segs)


def test_positions_out_of_range_are_refused() -> None:
    blend = Blend([(0, [1, 1])])
    with pytest.raises(BlendError, match="2\\*\\*62"):
        blend.picks(-1, 3)
    with pytest.raises(BlendError, match="reversed"):
        blend.picks(5, 3)
