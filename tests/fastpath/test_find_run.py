"""The bucketed run lookup of the record gather equals a plain binary search, for any table."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.loader.jit.search import bucket_index, find_run, last_at_or_below

_END = np.iinfo(np.int64).max


@st.composite
def tables(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """A staging-style table (``[0, s0, e0, s1, e1, ..., END]``, runs may touch) or a
    shard-starts table, and ids to look up, some past every run."""
    gaps = draw(st.lists(st.integers(0, 2**34), min_size=0, max_size=60))
    starts = np.concatenate([[0], np.cumsum(gaps, dtype=np.int64)])
    if draw(st.booleans()):
        starts = np.concatenate([starts, [_END]])
    top = int(starts[-2]) if len(starts) > 1 and starts[-1] == _END else int(starts[-1])
    ids = draw(st.lists(st.integers(0, top + 2**20), min_size=1, max_size=50))
    return starts.astype(np.int64), np.array(ids, dtype=np.int64)


@settings(max_examples=300, deadline=None)
@given(tables())
def test_find_run_equals_the_binary_search(case: tuple[np.ndarray, np.ndarray]) -> None:
    starts, ids = case
    if len(starts) < 2:
        starts = np.concatenate([starts, [_END]]).astype(np.int64)
    shift, bucket = bucket_index(starts)
    assert len(bucket) <= 2 * len(starts) + 2  # bounded by the table, not the id range
    last = len(starts) - 1
    for x in ids.tolist():
        assert find_run(starts, shift, bucket, x) == last_at_or_below(starts, x, 0, last), x


def test_find_run_catches_a_wrong_bucket() -> None:
    """The property above can fail: a bucket pointing past the run misses it."""
    starts = np.array([0, 10, 20, 30, _END], dtype=np.int64)
    shift, bucket = bucket_index(starts)
    assert find_run(starts, shift, bucket, 25) == 2
    bad = bucket.copy()
    bad[25 >> shift] = 3
    assert find_run(starts, shift, bad, 25) != 2
