"""A mixture's remote sources behave like one dataset toward the node cache:

- one budget (stoker.loader.read.mixture_budget): each cached source gets a share of
  ``CacheOptions(limit=...)`` (its working set first, the rest in proportion to what it lacks
  to hold all its shards), the cache directory never holds more than the limit, and working
  sets that cannot all fit are refused at construction;
- a future (stoker.loader.read.mixture_future): each source's cache is told every shard its
  picks will read for the rest of the epoch, passes included, and where the reader is, so it
  prefetches and evicts by the next use.

Before (6ad937e), every remote source's cache was given the whole limit (two sources could
fill twice the disk the user allowed; a limit too small for both working sets passed) and no
future (no prefetching, eviction blind)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cache_disk import disk_use
from hypothesis import given, settings
from hypothesis import strategies as st
from mixture_helpers import expected, make_source, pairs

from stoker.loader import CacheOptions, DataLoader, ShuffleOptions
from stoker.loader.order.epoch import EpochOrder, OrderOptions
from stoker.loader.order.mixture import Mixture
from stoker.loader.order.working_set import working_set
from stoker.loader.read.mixture_budget import split_cache_limit
from stoker.loader.read import mixture_future
from stoker.loader.read.order_plan import WorkingSetError

SHUFFLE = ShuffleOptions(partitions=2, block_size=16)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 10**12), st.integers(0, 10**12)), min_size=1,
                max_size=6),
       st.integers(1, 6 * 10**12))
def test_the_shares_keep_to_the_limit_and_give_every_source_its_working_set(
        sources: list[tuple[int, int]], limit: int) -> None:
    needs = [n for n, _ in sources]
    sizes = [s for _, s in sources]
    names = [f"s{i}" for i in range(len(sources))]
    if sum(needs) > limit:
        with pytest.raises(WorkingSetError) as info:
            split_cache_limit(limit, needs, sizes, names)
        assert all(f"s{i}: {n} B" in str(info.value) for i, n in enumerate(needs))
        assert f"at least {sum(needs)} B" in str(info.value)
        return
    shares = split_cache_limit(limit, needs, sizes, names)
    assert sum(shares) <= limit
    assert all(need <= share <= max(need, size)
               for share, need, size in zip(shares, needs, sizes))
    if sum(max(n, s) for n, s in sources) <= limit:  # room for everything: all kept whole
        assert shares == [max(n, s) for n, s in sources]
    else:  # the budget is used up to rounding (one byte per source)
        assert limit - sum(shares) < len(sources)


def test_what_is_left_goes_in_proportion_to_what_each_source_lacks() -> None:
    # needs 10 and 20; lacking 90 and 30 to hold all shards; 60 left: 45 and 15 of it
    assert split_cache_limit(90, [10, 20], [100, 50], ["a", "b"]) == [55, 35]


def _committed(root: Path) -> int:
    """Shard bytes committed in every dataset cache under ``root``, as the disk sees them."""
    return sum(disk_use(d)[0] for d in root.iterdir() if d.is_dir())


@pytest.fixture
def remote_pair(nginx, tmp_path: Path):
    """Two remote sources of 24 shards of 40 rows each (served by one nginx)."""
    root = tmp_path / "served"
    a = make_source(root / "a", [40] * 24, salt=3)
    b = make_source(root / "b", [40] * 24, salt=4)
    server = nginx(root)
    sizes = [int(m.shard_bytes.sum()) for m in (a, b)]
    return Mixture({"a": f"{server.url}/a", "b": f"{server.url}/b"}, {"a": 1, "b": 1}), sizes


@pytest.mark.remote
def test_two_remote_sources_share_one_limit(remote_pair, tmp_path: Path) -> None:
    mix, sizes = remote_pair
    limit = int(0.6 * sum(sizes))  # more than either source, less than both
    cache = tmp_path / "cache"
    dl = DataLoader(mix, batch_size=32, shuffle=SHUFFLE, seed=5,
                    cache=CacheOptions(dir=cache, limit=limit))
    caches = [c for c in dl._source._caches if c is not None]
    assert len(caches) == 2 and sum(c.limit for c in caches) <= limit
    got = []
    for epoch in range(2):
        dl.set_epoch(epoch)
        got += pairs(dl)
        assert _committed(cache) <= limit  # shards on disk, whatever each cache holds
    dl.close()
    assert got == expected(mix, 5, 0, 2 * mix.num_samples, dl.order_options)


@pytest.mark.remote
def test_working_sets_that_cannot_all_fit_are_refused_at_construction(remote_pair,
                                                                     tmp_path: Path) -> None:
    mix, _ = remote_pair
    needs = [working_set(m.shard_rows, m.shard_bytes, OrderOptions(
        partitions=SHUFFLE.partitions, block_size=SHUFFLE.block_size).resolve(m.shard_rows)
    ).shard_bytes for m in mix.manifests]
    too_small = max(needs) + min(needs) // 2  # holds either source's working set, not both
    with pytest.raises(WorkingSetError, match=rf"a: {needs[0]} B, b: {needs[1]} B") as info:
        DataLoader(mix, batch_size=32, shuffle=SHUFFLE, seed=5,
                   cache=CacheOptions(dir=tmp_path / "cache", limit=too_small))
    assert f"the cache limit is {too_small} B" in str(info.value)
    assert f"at least {sum(needs)} B" in str(info.value)


class _Recorder:
    """What a shard cache is told: its future and its cursor (the real cache's two calls)."""

    def __init__(self) -> None:
        self.shards = self.spans = None
        self.cursor: list[int] = []

    def set_future(self, shards, spans) -> None:
        self.shards, self.spans = np.asarray(shards), np.asarray(spans)

    def advance_to(self, position: int) -> None:
        self.cursor.append(position)


@pytest.mark.parametrize("epoch,step,rank,world", [(0, 0, 0, 1), (1, 3, 0, 1), (2, 11, 1, 2),
                                                   (0, 5, 0, 2)])
def test_each_source_cache_is_told_every_shard_this_rank_will_read(
        sources, monkeypatch, epoch: int, step: int, rank: int, world: int) -> None:
    # books (13 samples) is read over several passes per epoch; a short window (4 global
    # batches) makes the clock renew the futures several times
    monkeypatch.setattr(mixture_future, "AHEAD", 4)
    mix = Mixture({n: str(p) for n, p in sources.items()}, {"web": 3, "code": 2, "books": 2})
    dl = DataLoader(mix, batch_size=8, shuffle=ShuffleOptions(partitions=2, block_size=4),
                    seed=7, rank=rank, world_size=world)
    order = dl._source.epoch_order(7, epoch, dl.order_options)
    plan = dl._plan
    caches = [_Recorder() for _ in mix.names]
    clock = mixture_future.mixture_clock(caches, order, plan, step)
    starts = [np.cumsum(m.shard_rows) - m.shard_rows for m in mix.manifests]
    for s in range(step, plan.steps_per_epoch):
        if s > step:
            clock(s)
        lo, hi = plan.window(s)
        assert all(c.cursor[-1] == lo for c in caches)  # the cursor: the step's first position
        positions = range(lo + (rank - lo) % world, hi, world)
        for k, sample in zip(positions, order.rank_ids(lo, hi, rank, world).tolist()):
            i = int(np.searchsorted(mix.offsets, sample, side="right") - 1)
            shard = int(np.searchsorted(starts[i], sample - mix.offsets[i], side="right") - 1)
            c = caches[i]  # the read at position k has a use of its shard that spans k
            assert ((c.shards == shard) & (c.spans[:, 0] <= k) & (k <= c.spans[:, 1])).any()
    dl.close()


@pytest.mark.remote
def test_remote_sources_are_prefetched_from_their_future(remote_pair, tmp_path: Path) -> None:
    mix, sizes = remote_pair
    dl = DataLoader(mix, batch_size=32, shuffle=SHUFFLE, seed=5,
                    cache=CacheOptions(dir=tmp_path / "cache", limit=int(0.6 * sum(sizes))))
    got = pairs(dl)
    stats = [c.stats() for c in dl._source._caches]
    dl.close()
    assert got == expected(mix, 5, 0, mix.num_samples, dl.order_options)
    assert all(s.prefetches > 0 for s in stats), stats  # none before: no future was given


@pytest.mark.remote
def test_with_several_ranks_a_rank_fetches_only_the_shards_it_reads(remote_pair,
                                                                     tmp_path: Path) -> None:
    # every rank's picks would be a superset of this rank's: a node holding rank 0 only
    # would fetch rank 1's shards too (with weights 1:1 the ranks even read disjoint sources)
    mix, sizes = remote_pair
    for rank in range(2):
        dl = DataLoader(mix, batch_size=32, shuffle=SHUFFLE, seed=5, rank=rank, world_size=2,
                        cache=CacheOptions(dir=tmp_path / f"cache{rank}", limit=sum(sizes)))
        read = pairs(dl)
        fetched = [c.stats().fetches for c in dl._source._caches]
        dl.close()
        shards_read = [len({i // 40 for s, i in read if s == src}) for src in range(2)]
        assert all(f <= r for f, r in zip(fetched, shards_read)), (rank, fetched, shards_read)


def test_local_sources_read_through_one_cached_reader_keep_the_whole_limit(
        tmp_path: Path) -> None:
    # with a cache directory, local sources sharing one reader (the union) have one cache and
    # one working set: a limit that holds it is not split, nor refused for the sum of the
    # sources' own working sets
    a = make_source(tmp_path / "a", [40] * 24, salt=3)
    b = make_source(tmp_path / "b", [40] * 24, salt=4)
    mix = Mixture({"a": str(tmp_path / "a"), "b": str(tmp_path / "b")}, {"a": 1, "b": 1})
    needs = [working_set(m.shard_rows, m.shard_bytes, OrderOptions(
        partitions=SHUFFLE.partitions, block_size=SHUFFLE.block_size).resolve(m.shard_rows)
    ).shard_bytes for m in (a, b)]
    limit = max(needs) + min(needs) // 2  # below the sum of the two working sets
    dl = DataLoader(mix, batch_size=32, shuffle=SHUFFLE, seed=5,
                    cache=CacheOptions(dir=tmp_path / "cache", limit=limit))
    assert dl._source.union and [c.limit for c in dl._source._caches] == [limit]
    assert pairs(dl) == expected(mix, 5, 0, mix.num_samples, dl.order_options)
    dl.close()
