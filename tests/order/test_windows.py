"""Windows: consecutive batch windows cut from chunks of the order equal the order's own."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from order_model import options, shard_rows

from stoker.loader.order.epoch import EpochOrder, OrderError, OrderOptions
from stoker.loader.order.schedule import BatchPlan, batch_ids, rank_batch_ids
from stoker.loader.order.windows import Windows

PROPS = settings(max_examples=60, deadline=None)


@PROPS
@given(rows=shard_rows, opts=options, world=st.sampled_from([1, 2, 4]),
       batch=st.integers(1, 40), chunk=st.integers(1, 100), data=st.data())
def test_consecutive_windows_from_chunks_equal_the_order(rows, opts, world, batch, chunk,
                                                         data) -> None:
    """Every rank's batch windows of an epoch (chunks smaller and larger than a batch, so
    windows cross chunk borders), then jumps back and forth: the order's own ids."""
    opts = OrderOptions(shuffle=opts.shuffle, partitions=4 * (opts.partitions or 1),
                        block_size=opts.block_size, partition_mode=opts.partition_mode)
    order = EpochOrder(np.asarray(rows, dtype=np.int64), "fp", 3, 2, opts)
    n = order.num_samples
    for rank in range(world):
        windows = Windows(order._range, n, chunk)
        spans = [(s, min(n, s + batch)) for s in range(0, n, batch)]
        spans += [(data.draw(st.integers(0, n)), n), (0, min(n, batch))]
        for start, stop in spans:
            got = windows.rank_ids(start, stop, rank, world)
            assert got.tolist() == order.rank_ids(start, stop, rank, world).tolist()


def test_the_loader_s_batches_come_from_chunks_and_equal_rank_batch_ids() -> None:
    rows = np.full(40, 1000, dtype=np.int64)
    order = EpochOrder(rows, "fp", 1, 0, OrderOptions(shuffle=True, partitions=40))
    plan = BatchPlan(order.num_samples, 1024, world_size=2, rank=1)
    ids = batch_ids(order, plan)
    for step in range(plan.steps_per_epoch):
        assert np.array_equal(ids(step), rank_batch_ids(order, plan, step))
    assert isinstance(order.windows(), Windows)
    natural = EpochOrder(rows, "fp", 1, 0, OrderOptions(shuffle=False))
    assert natural.windows() is natural  # nothing to set up per call


def test_chunks_computed_ahead_give_the_same_ids() -> None:
    rows = np.full(30, 100, dtype=np.int64)
    order = EpochOrder(rows, "fp", 4, 1, OrderOptions(shuffle=True, partitions=6))
    with ThreadPoolExecutor(1) as pool:
        windows = Windows(order._range, order.num_samples, 64, pool.submit)
        for start in range(0, order.num_samples, 50):
            stop = min(order.num_samples, start + 50)
            assert windows.rank_ids(start, stop, 1, 3).tolist() == \
                order.rank_ids(start, stop, 1, 3).tolist()
    assert windows.chunks_ahead >= order.num_samples // 64 - 2


def test_windows_reject_bad_ranks_and_positions() -> None:
    order = EpochOrder(np.full(3, 10, dtype=np.int64), "fp", 0, 0, OrderOptions(shuffle=True))
    windows = order.windows()
    with pytest.raises(OrderError, match="rank must be in"):
        windows.rank_ids(0, 5, 2, 2)
    with pytest.raises(OrderError, match="must satisfy"):
        windows.rank_ids(5, 31, 0, 1)
