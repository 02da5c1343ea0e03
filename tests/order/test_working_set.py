"""The working set is an upper bound of what a rank touches, and defaults never depend on W."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.loader.order.epoch import EpochOrder, OrderOptions
from stoker.loader.order.working_set import (PARTITION_LADDER, STAGED_ROUNDS, default_partitions,
                                       working_set)


@st.composite
def cases(draw):  # type: ignore[no-untyped-def]
    rows = np.array(draw(st.lists(st.integers(0, 60), min_size=1, max_size=14)), dtype=np.int64)
    P = draw(st.sampled_from([1, 2, 3, 4, 6, 12]))
    W = draw(st.sampled_from([w for w in (1, 2, 3, 4, 6, 12) if P % w == 0]))
    K = draw(st.integers(1, 40))
    mode = draw(st.sampled_from(["redraw", "fixed"]))
    seed, epoch = draw(st.integers(0, 50)), draw(st.integers(0, 3))
    return rows, P, W, K, mode, seed, epoch


@settings(max_examples=150, deadline=None)
@given(cases())
def test_no_window_of_rounds_exceeds_the_working_set(case) -> None:  # type: ignore[no-untyped-def]
    rows, P, W, K, mode, seed, epoch = case
    if rows.sum() == 0:
        return
    opts = OrderOptions(partitions=P, block_size=K, partition_mode=mode)
    order = EpochOrder(rows, "fp", seed, epoch, opts)
    ws = working_set(rows, rows * 10 + 1, order.options, W, stride=8)
    starts = np.concatenate([[0], np.cumsum(rows)])
    N = order.num_samples
    ids = order.ids(0, N)
    k = np.arange(N)
    block = (k // P) // K
    for r in range(W):
        mine = k % W == r
        for b in range(order.blocks_per_partition()):
            live = mine & (block >= b) & (block < b + STAGED_ROUNDS)
            shards = np.unique(np.searchsorted(starts, ids[live], side="right") - 1)
            assert len(shards) <= ws.shards, (b, r)
            assert int(live.sum()) <= ws.staged_rows
    assert ws.staging_bytes == ws.staged_rows * 8


def test_the_bound_is_tight_enough_to_matter() -> None:
    # 1000 shards of 10,000 rows, P=24, K=1024: two partial shards per partition and round
    rows = np.full(1000, 10_000)
    ws = working_set(rows, rows * 400, OrderOptions(partitions=24, block_size=1024), 1, 400)
    assert ws.shards == 24 * 2 and ws.shard_bytes == (24 * 2 + 2) * 10_000 * 400
    assert ws.staged_rows == STAGED_ROUNDS * 24 * 1024


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 10**6), min_size=1, max_size=50), st.integers(1, 4096),
       st.integers(0, 2000), st.one_of(st.none(), st.integers(10**5, 10**12)))
def test_default_partitions_fit_their_budgets(rows, batch, stride, cache_limit) -> None:  # type: ignore[no-untyped-def]
    rows = np.array(rows, dtype=np.int64)
    sizes = rows * 300
    P = default_partitions(rows, sizes, stride, cache_limit, staging_limit=1 << 28)
    assert P in PARTITION_LADDER and P <= max(24, int(rows.sum()) // 1024)
    ws = working_set(rows, sizes, OrderOptions(partitions=P, block_size=1024), 1, stride)
    if P > 1:
        assert ws.staging_bytes <= 1 << 28
        assert cache_limit is None or ws.shard_bytes <= cache_limit
    # any world size that divides P needs no more per rank than world size 1
    for w in (d for d in range(1, P + 1) if P % d == 0):
        assert working_set(rows, sizes, OrderOptions(partitions=P, block_size=1024), w,
                           stride).shard_bytes <= ws.shard_bytes
