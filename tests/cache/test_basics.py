"""ShardCache on local and file:// datasets: verified copies, warm restarts, options, API."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from stoker.cache import CacheLimitError, RetryPolicy, ShardCache, open_dataset, parse_size
from stoker.manifest import Manifest


def _read_ids(path: str) -> list[int]:
    with pa.memory_map(path) as source:
        return pa.ipc.open_file(source).read_all().column("id").to_pylist()


def test_every_shard_is_a_byte_identical_verified_copy(dataset, tmp_path: Path) -> None:
    root, manifest = dataset(n_shards=4)
    with ShardCache(manifest, tmp_path / "cache", prefetch_workers=0) as cache:
        for i in range(4):
            with cache.pin(i) as local:
                assert Path(local).read_bytes() == (root / manifest.shards[i].path).read_bytes()
                assert local.startswith(str(tmp_path / "cache"))
        s = cache.stats()
        assert (s.hits, s.misses, s.fetches) == (0, 4, 4)
        assert s.bytes_fetched == int(manifest.shard_bytes.sum())
        cache.path(2)
        assert cache.stats().hits == 1


def test_file_url_and_open_dataset(dataset, tmp_path: Path) -> None:
    root, manifest = dataset(n_shards=2)
    m, cache = open_dataset(root)
    assert cache is None and m.fingerprint == manifest.fingerprint  # local + uncompressed: in place
    m, cache = open_dataset(f"file://{root}", cache_dir=tmp_path / "c", prefetch_workers=0)
    assert cache is not None
    with cache:
        assert _read_ids(cache.path(1))[0] == manifest.shards[0].rows


def test_warm_restart_trusts_sidecars_without_fetching(dataset, tmp_path: Path) -> None:
    root, manifest = dataset(n_shards=3)
    with ShardCache(manifest, tmp_path / "c", prefetch_workers=0) as cache:
        for i in range(3):
            cache.path(i)
    os.remove(root / manifest.shards[0].path)  # a warm cache must not even look at the source
    with ShardCache(manifest, tmp_path / "c", prefetch_workers=0) as warm:
        for i in range(3):
            warm.path(i)
        s = warm.stats()
        assert (s.hits, s.misses, s.bytes_fetched, s.repaired) == (3, 0, 0, 0)


def test_nested_and_concurrent_pins_count(dataset, tmp_path: Path) -> None:
    _, manifest = dataset(n_shards=2)
    with ShardCache(manifest, tmp_path / "c", prefetch_workers=0) as cache:
        with cache.pin(0) as a, cache.pin(0) as b:
            assert a == b
        assert cache.stats().misses == 1 and cache.stats().hits == 1


def test_closed_cache_refuses_and_close_is_idempotent(dataset, tmp_path: Path) -> None:
    _, manifest = dataset(n_shards=1)
    cache = ShardCache(manifest, tmp_path / "c")
    cache.close()
    cache.close()
    with pytest.raises(Exception, match="closed"):
        cache.path(0)


@pytest.mark.parametrize(("bad", "match"), [
    ({"prefetch_workers": -1}, "prefetch_workers"),
    ({"eviction": "fifo"}, "eviction"),
    ({"limit": "lots"}, "limit"),
    ({"limit": 10}, "cannot hold shard"),
    ({"inflight_allowance": 10}, "inflight_allowance"),
])
def test_bad_options_are_clear_errors(dataset, tmp_path: Path, bad, match) -> None:
    _, manifest = dataset(n_shards=2)
    with pytest.raises((ValueError, CacheLimitError), match=match):
        ShardCache(manifest, tmp_path / "c", **bad)


def test_limit_smaller_than_largest_shard_names_shard_and_fix(dataset, tmp_path: Path) -> None:
    _, manifest = dataset(n_shards=3)
    largest = int(manifest.shard_bytes.max())
    with pytest.raises(CacheLimitError) as err:
        ShardCache(manifest, tmp_path / "c", limit=largest - 1)
    msg = str(err.value)
    assert "shard 2" in msg and str(largest) in msg and "Raise the cache limit" in msg


def test_index_checks(dataset, tmp_path: Path) -> None:
    _, manifest = dataset(n_shards=2)
    with ShardCache(manifest, tmp_path / "c", prefetch_workers=0) as cache:
        with pytest.raises(IndexError, match="out of range"):
            cache.path(2)
        with pytest.raises(ValueError, match="out of range"):
            cache.set_future([0, 5])


def test_in_memory_manifest_is_refused(dataset, tmp_path: Path) -> None:
    _, manifest = dataset(n_shards=1)
    with pytest.raises(ValueError, match="Manifest.load"):
        ShardCache(Manifest.from_dict(manifest.to_dict()), tmp_path / "c")


@pytest.mark.parametrize(("text", "expected"), [
    ("50GB", 50 * 10**9), ("512MiB", 512 << 20), ("1.5K", 1536), (123, 123), ("7", 7),
])
def test_parse_size(text, expected) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["-1", "1 XB", "", True, -5])
def test_parse_size_rejects(bad) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(bad)


def test_retry_policy_delays() -> None:
    import random

    p = RetryPolicy(backoff_base=1.0, backoff_max=5.0, jitter=0.0, max_retry_after=10.0)
    assert [p.delay(k) for k in (1, 2, 3, 4, 5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert p.delay(1, retry_after=7.0) == 7.0 and p.delay(1, retry_after=99.0) == 10.0
    j = RetryPolicy(backoff_base=1.0, jitter=1.0)
    draws = {j.delay(3, rng=random.Random(s)) for s in range(20)}
    assert len(draws) == 20 and all(0.0 <= d <= 4.0 for d in draws)
    with pytest.raises(ValueError, match="jitter"):
        RetryPolicy(jitter=2.0)


def test_pickled_cache_reopens_the_same_directory(dataset, tmp_path: Path) -> None:
    import pickle

    _, manifest = dataset(n_shards=2)
    with ShardCache(manifest, tmp_path / "c", prefetch_workers=1, limit="1GB") as cache:
        cache.path(0)
        with pickle.loads(pickle.dumps(cache)) as clone:
            assert clone.directory == cache.directory and clone.limit == 10**9
            clone.path(0)
            assert (clone.stats().hits, clone.stats().fetches) == (1, 0)


def test_cache_inherited_through_fork_is_refused(dataset, tmp_path: Path) -> None:
    import multiprocessing as mp

    _, manifest = dataset(n_shards=1)
    with ShardCache(manifest, tmp_path / "c", prefetch_workers=0) as cache:
        ctx = mp.get_context("fork")
        queue = ctx.Queue()

        def child() -> None:
            try:
                cache.path(0)
                queue.put("no error")
            except Exception as exc:  # noqa: BLE001 - reported to the parent
                queue.put(str(exc))

        proc = ctx.Process(target=child)
        proc.start()
        message = queue.get(timeout=30)
        proc.join(30)
    assert "another process" in message and "per process" in message
