"""I/O locality the design promises: ranks read their own shards, a window touches few shards."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stoker.loader.order.epoch import EpochOrder, OrderOptions, locate


def _rank_shards(order: EpochOrder, cum: np.ndarray, start: int, stop: int, rank: int,
                 world: int) -> set[int]:
    return set(locate(cum, order.rank_ids(start, stop, rank, world))[0].tolist())


@pytest.mark.parametrize("mode", ["redraw", "fixed"])
@pytest.mark.parametrize("world", [2, 4, 8])
def test_ranks_share_only_shards_straddling_partition_boundaries(mode: str, world: int) -> None:
    rng = np.random.default_rng(world)
    rows = rng.integers(0, 60, size=90)
    cum = np.cumsum(rows)
    P = 8
    for epoch in range(3):
        order = EpochOrder(rows, "fp", 1, epoch, OrderOptions(partitions=P, block_size=16,
                                                              partition_mode=mode))
        n = order.num_samples
        per_rank = [_rank_shards(order, cum, 0, n, r, world) for r in range(world)]
        assert set().union(*per_rank) == set(np.flatnonzero(rows).tolist())
        shared = [s for s in range(len(rows)) if sum(s in mine for mine in per_rank) > 1]
        assert len(shared) <= P - 1
        for r in range(world):
            assert order.shard_sequence(0, n, r, world).tolist() == \
                list(dict.fromkeys(locate(cum, order.rank_ids(0, n, r, world))[0].tolist()))


@pytest.mark.parametrize("mode, slack", [("redraw", 0), ("fixed", 2)])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_live_shards_per_window_are_bounded(mode: str, slack: int, world: int) -> None:
    """Each of a rank's P/W cursors sits in one block: <= P/W x (ceil(K/s) + 1) live shards.

    In "fixed" mode a partition may begin and end with a part of a shard (up to 2 extra).
    """
    s, P, K = 10, 4, 25
    rows = np.full(60, s, dtype=np.int64)
    cum = np.cumsum(rows)
    order = EpochOrder(rows, "fp", 9, 1, OrderOptions(partitions=P, block_size=K,
                                                      partition_mode=mode))
    bound = (P // world) * (math.ceil(K / s) + 1 + slack)
    n = order.num_samples
    for b in range(math.ceil(n / (P * K))):
        start, stop = b * P * K, min(n, (b + 1) * P * K)
        for r in range(world):
            assert len(_rank_shards(order, cum, start, stop, r, world)) <= bound
    # A global batch that is not block aligned spans at most two blocks per cursor.
    for start in range(0, n - 37, 37):
        for r in range(world):
            assert len(_rank_shards(order, cum, start, start + 37, r, world)) <= 2 * bound


def test_shard_sequence_of_a_huge_epoch_is_cheap() -> None:
    rows = np.full(40_000, 250_000, dtype=np.int64)
    order = EpochOrder(rows, "big", 1, 0, OrderOptions(partitions=8))
    seq = order.shard_sequence(0, order.num_samples, 1, 4)
    # Rank 1 of 4 owns partitions 1 and 5: a quarter of the shards plus boundary pieces.
    assert 10_000 <= len(seq) <= 10_002 and len(set(seq.tolist())) == len(seq)
    first = set(locate(np.cumsum(rows), order.rank_ids(0, 4 * 64, 1, 4))[0].tolist())
    assert first == set(seq[:len(first)].tolist())
