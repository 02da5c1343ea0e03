"""Belady with the whole future: a shard needed again later is kept for that use (issue 14, 6).

An order whose shards straddle partitions reads them twice in an epoch (early in one
partition, late in the next). The test replays such an order against a real ``ShardCache``
(local files, no prefetch threads, a budget of a few shards), steering it exactly as the
loader does (``EpochOrder.shard_uses`` -> ``set_future(shards, spans)``, ``advance_to`` per
step), and compares its fetch count with the offline optimum (Belady's MIN over the exact
access sequence). The first-use future the loader used to hand over (each shard once) costs
a fetch per recurring shard more.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from shard_writer import write_dataset  # noqa: E402

from stoker.cache import ShardCache  # noqa: E402
from stoker.cache.store.future import FutureIndex  # noqa: E402
from stoker.loader.order.epoch import EpochOrder, OrderOptions  # noqa: E402
from stoker.loader.order.schedule import BatchPlan, rank_batch_ids  # noqa: E402
from stoker.manifest import Manifest  # noqa: E402


def _dataset(root: Path, shards: int, rows: int) -> Manifest:
    tables = [pa.table({"x": np.arange(i * rows, (i + 1) * rows, dtype=np.int64)})
              for i in range(shards)]
    return write_dataset(root, tables, batch_rows=rows)


def _accesses(order: EpochOrder, plan: BatchPlan, m: Manifest) -> list[list[int]]:
    """Per step, the shards it reads (first appearance order): what a reader opens."""
    cum = np.cumsum(m.shard_rows)
    out = []
    for step in range(plan.steps_per_epoch):
        shard = np.searchsorted(cum, rank_batch_ids(order, plan, step), side="right")
        _, first = np.unique(shard, return_index=True)
        out.append(shard[np.sort(first)].tolist())
    return out


def belady_min(seq: list[int], capacity: int) -> int:
    """Fetches of the offline optimum: on a miss, evict what is accessed again furthest away."""
    resident: set[int] = set()
    fetches = 0
    for i, s in enumerate(seq):
        if s in resident:
            continue
        fetches += 1
        if len(resident) >= capacity:
            def next_access(x: int) -> int:
                return next((j for j in range(i + 1, len(seq)) if seq[j] == x), 1 << 62)
            resident.remove(max(resident, key=next_access))
        resident.add(s)
    return fetches


def _replay(m: Manifest, cache_dir: Path, capacity: int, steps: list[list[int]],
            steer: Callable[[ShardCache], Any]) -> int:
    with ShardCache(m, cache_dir, limit=capacity * int(m.shard_bytes.max()),
                    prefetch_workers=0) as cache:
        clock = steer(cache)
        for step, shards in enumerate(steps):
            if clock is not None:
                clock(step)
            for s in shards:
                with cache.pin(s):
                    pass
        return cache.stats().fetches


@pytest.mark.parametrize("shards,rows,partitions,batch,capacity", [
    (9, 40, 2, 2, 3),     # one shard straddles the two partitions
    (14, 30, 3, 3, 5),    # two straddle
    (14, 30, 3, 3, 4),    # a budget where even the optimum fetches one shard twice
])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fetches_match_the_offline_optimum(tmp_path: Path, shards: int, rows: int,
                                           partitions: int, batch: int, capacity: int,
                                           seed: int) -> None:
    m = _dataset(tmp_path / "d", shards, rows)
    order = EpochOrder(m.shard_rows, m.fingerprint, seed, 0,
                       OrderOptions(partitions=partitions, block_size=10))
    plan = BatchPlan(m.num_samples, batch)
    steps = _accesses(order, plan, m)
    flat = [s for step in steps for s in step]
    optimum = belady_min(flat, capacity)

    def whole_future(cache: ShardCache) -> Callable[[int], None]:  # what the loader does
        uses, first, last = order.shard_uses(0, m.num_samples)
        cache.set_future(uses, np.stack([first, last], axis=1))
        return lambda step: cache.advance_to(plan.window(step)[0])

    def first_uses(cache: ShardCache) -> None:  # what it did on 5871c69
        cache.set_future(order.shard_sequence(0, m.num_samples).tolist())

    uses, _, _ = order.shard_uses(0, m.num_samples)
    recurring = len(uses) - len(set(uses.tolist()))
    assert recurring >= 1  # the order really reads some shard twice
    assert _replay(m, tmp_path / "full", capacity, steps, whole_future) == optimum
    assert _replay(m, tmp_path / "first", capacity, steps, first_uses) > optimum


def test_shard_uses_cover_every_read_and_start_at_one() -> None:
    rng = np.random.default_rng(7)
    for trial in range(40):
        rows = rng.integers(1, 90, size=int(rng.integers(2, 10))).astype(np.int64)
        partitions = int(rng.choice([1, 2, 4, 8]))
        order = EpochOrder(rows, "ab" * 16, trial, trial % 3, OrderOptions(
            partitions=partitions, block_size=int(rng.choice([0, 5, 40])),
            partition_mode=str(rng.choice(["redraw", "fixed"])), shuffle=bool(trial % 5)))
        world = int(rng.choice([w for w in (1, 2, 4) if partitions % w == 0]))
        n = order.num_samples
        start = int(rng.integers(0, n))
        stop = int(rng.integers(start, n + 1))
        for rank in range(world):
            shards, first, last = order.shard_uses(start, stop, rank, world)
            ks = np.arange(start + (rank - start) % world, stop, world)
            read = np.searchsorted(np.cumsum(rows), order.ids_at(ks), side="right")
            for k, s in zip(ks.tolist(), read.tolist()):  # every read lies in a use of its shard
                assert ((shards == s) & (first <= k) & (k <= last)).any(), (trial, k, s)
            for s, f in zip(shards.tolist(), first.tolist()):  # each use starts at a real read
                assert f in ks[read == s].tolist(), (trial, s, f)
            assert (np.diff(first) >= 0).all()


def test_a_timed_future_is_not_moved_by_reads() -> None:
    future = FutureIndex([3, 5, 3], 8, np.array([[0, 9], [10, 19], [20, 29]]))
    assert future.next_use(3) == 0 and future.next_use(5) == 10
    future.advance(3, window=100)  # a re-read inside the first use: no jump
    assert future.cursor == 0
    future.advance_to(12)
    assert future.next_use(3) == 20 and future.next_use(5) == 12 and future.next_use(1) == np.inf
    assert future.upcoming(3) == [5, 3]
    future.advance_to(30)
    assert future.next_use(3) == np.inf and future.upcoming(3) == []
