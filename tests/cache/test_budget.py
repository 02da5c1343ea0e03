"""Byte budget and eviction: Belady's misses exactly, pins respected, disk use sampled."""

from __future__ import annotations

import math
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from cache_disk import disk_use

from stoker.cache import CacheLimitError, ShardCache
from stoker.manifest import hash_file


def _reference_misses(seq: list[int], capacity: int, policy: str) -> int:
    """Textbook demand paging: OPT (Belady) or LRU, counting misses."""
    cached: list[int] = []
    misses = 0
    for pos, s in enumerate(seq):
        if s in cached:
            cached.remove(s)
            cached.append(s)
            continue
        misses += 1
        if len(cached) == capacity:
            if policy == "lru":
                cached.pop(0)
            else:
                def nxt(c: int) -> float:
                    later = [p for p in range(pos + 1, len(seq)) if seq[p] == c]
                    return later[0] if later else math.inf
                cached.remove(max(cached, key=nxt))
        cached.append(s)
    return misses


def _equal_shards(dataset, n: int):
    root, manifest = dataset(n_shards=n, grow=0)
    sizes = set(manifest.shard_bytes.tolist())
    assert len(sizes) == 1
    return root, manifest, sizes.pop()


@pytest.mark.parametrize("policy", ["belady", "lru"])
def test_misses_equal_the_textbook_policy(dataset, tmp_path: Path, policy: str) -> None:
    _, manifest, size = _equal_shards(dataset, 8)
    rng = np.random.default_rng(7)
    seq = [int(s) for s in np.concatenate([rng.permutation(8) for _ in range(4)])]
    capacity = 3
    with ShardCache(manifest, tmp_path / "c", limit=capacity * size + size // 2,
                    prefetch_workers=0, eviction=policy) as cache:
        cache.set_future(seq)
        for s in seq:
            with cache.pin(s):
                pass
        stats = cache.stats()
    expected = _reference_misses(seq, capacity, policy)
    assert stats.misses == expected
    assert stats.evictions == expected - capacity
    if policy == "belady":
        assert expected < _reference_misses(seq, capacity, "lru")  # the test can tell them apart


def test_pinned_shard_is_never_evicted(dataset, tmp_path: Path) -> None:
    root, manifest, size = _equal_shards(dataset, 6)
    with ShardCache(manifest, tmp_path / "c", limit=3 * size, prefetch_workers=0) as cache:
        cache.set_future([0, 1, 2, 3, 4, 5])
        with cache.pin(0) as kept:
            for s in range(1, 6):  # shard 0 is never needed again: Belady's first choice
                with cache.pin(s):
                    pass
            assert Path(kept).read_bytes() == (root / manifest.shards[0].path).read_bytes()
        assert cache.stats().evictions == 3
    assert os.path.exists(kept)


def test_pins_filling_the_limit_are_a_clear_error(dataset, tmp_path: Path) -> None:
    _, manifest, size = _equal_shards(dataset, 3)
    with ShardCache(manifest, tmp_path / "c", limit=2 * size, prefetch_workers=0) as cache:
        with cache.pin(0), cache.pin(1):
            with pytest.raises(CacheLimitError, match=r"pins 2 shards.*Raise the cache limit"):
                cache.path(2)
        cache.path(2)  # fine once the pins are gone


def test_prefetch_fills_ahead_of_need_without_breaking_belady(dataset, tmp_path: Path) -> None:
    # Two prefetch threads: they are admitted one at a time in need order, so neither can claim
    # shard 3 before room for shard 2 is reserved (see also test_prefetch_once.py).
    _, manifest, size = _equal_shards(dataset, 6)
    with ShardCache(manifest, tmp_path / "c", limit=3 * size, prefetch_workers=2,
                    prefetch_ahead=6) as cache:
        cache.set_future([0, 1, 2, 3, 4, 5])
        deadline = time.monotonic() + 10
        while cache.stats().prefetches < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # give a wrongly eager prefetcher the chance to evict
        cached = sorted(int(p.stem) for p in Path(cache.directory, "shards").iterdir())
        assert cached == [0, 1, 2]  # the three needed first; nothing evicted for later ones
        assert cache.stats().evictions == 0
        for s in range(3):
            with cache.pin(s):
                pass
        assert cache.stats().hits == 3


def test_disk_use_stays_within_limit_plus_allowance(dataset, tmp_path: Path) -> None:
    root, manifest = dataset(n_shards=12, rows=600)
    limit = int(manifest.shard_bytes.max()) * 4
    seq = [int(s) for s in np.random.default_rng(3).integers(0, 12, size=60)]
    samples: list[tuple[int, int]] = []
    stop = threading.Event()
    with ShardCache(manifest, tmp_path / "c", limit=limit, prefetch_workers=2,
                    prefetch_ahead=6) as cache:
        def sample() -> None:
            while not stop.is_set():
                samples.append(disk_use(cache.directory))

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            cache.set_future(seq)
            for s in seq:
                with cache.pin(s) as local:
                    assert hash_file(local)[0] == manifest.shards[s].xxh3_128
        finally:
            stop.set()
            sampler.join()
        allowance = cache.inflight_allowance
        stats = cache.stats()
    assert len(samples) > 50 and stats.evictions > 0 and stats.prefetches > 0
    assert max(c for c, _ in samples) <= limit
    assert max(t for _, t in samples) <= limit + allowance


def test_limit_too_small_for_the_readers_open_shards_fails_at_start(dataset, tmp_path) -> None:
    _, manifest, size = _equal_shards(dataset, 6)
    with pytest.raises(CacheLimitError, match=r"4 shards the reader keeps open.*at least "
                       + str(5 * size)):
        ShardCache(manifest, tmp_path / "c", limit=5 * size - 1, max_pinned=4)
    ShardCache(manifest, tmp_path / "c", limit=5 * size, max_pinned=4).close()
