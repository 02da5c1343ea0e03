"""Cases 5, 6 and 7 of issue 8: a flaky network, dropped connections, refusals.

CI trial counts (``bench/faults_report.py`` scales them): case 5 runs 4 loaders over 48
shards (192 fetches; full: 42 loaders, 2,016 fetches); case 6 drops 16 downloads (full: 100);
case 7 runs each refusal once.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from fault_helpers import Figures, Stopwatch, expected_ids, ids_of, make_dataset, trials
from fault_server import Fault

from stoker.cache import RemoteFetchError, RetryPolicy, ShardCache
from stoker.loader import CacheOptions, DataLoader
from stoker.manifest import Manifest, ShardIntegrityError, hash_file

FLAKY_RUNS = trials(4, 42)
DROPS = trials(16, 100)
CHUNK = 1 << 20  # the HTTP client's read size (stoker.cache.fetch.http._CHUNK)
KW = dict(batch_size=16, shuffle=True, seed=5)
MAX_RETRIES = 8
# Small delays keep the suite fast; jitter 0 makes the exponential growth exact.
POLICY = RetryPolicy(max_retries=MAX_RETRIES, backoff_base=0.002, backoff_max=0.5, jitter=0.0,
                     max_retry_after=0.01, timeout=0.5)


def _random_fault(rng: random.Random, size: int) -> Fault | None:
    if rng.random() >= 0.2:
        return None
    kind = rng.randrange(4)
    if kind == 0:
        return Fault.status_code(503)
    if kind == 1:
        return Fault.status_code(429, retry_after=1)  # capped at max_retry_after
    if kind == 2:
        return Fault.reset(after=rng.randrange(size))
    return Fault.stall(after=rng.randrange(size), seconds=1.0)


@pytest.mark.remote
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_flaky_network_keeps_the_exact_sequence(fault_server, after_trial, tmp_path: Path,
                                                monkeypatch) -> None:
    root = tmp_path / "ds"
    manifest = make_dataset(root, [24 + (s % 5) for s in range(48)], batch_rows=8)
    fault_server.put_dir(root)
    expected = expected_ids(root, **KW)
    delays: list[tuple[int, float]] = []
    real_delay = RetryPolicy.delay

    def recording(self, retry, retry_after=None, rng=None):  # type: ignore[no-untyped-def]
        d = real_delay(self, retry, retry_after, rng)
        delays.append((retry, d, retry_after))
        return d

    monkeypatch.setattr(RetryPolicy, "delay", recording)
    figures = Figures("5 flaky network (p=0.2)")
    rng = random.Random(5)
    fetches = 0
    for run in range(FLAKY_RUNS):
        figures.start()
        for s in manifest.shards:
            fault_server.plan(s.path, *[_random_fault(rng, s.bytes) for _ in range(MAX_RETRIES)])
        cache = tmp_path / f"c{run}"
        ledger = tmp_path / f"r{run}.ledger"
        with Stopwatch() as sw:
            dl = DataLoader(fault_server.url, ledger=ledger,
                            cache=CacheOptions(dir=cache, **{"retry": POLICY}),
                            **KW)
            assert ids_of(dl) == expected
            stats = dl._cache.stats()
            dl.close()
        fetches += stats.fetches
        assert stats.fetches == manifest.num_shards and stats.retries > 0, stats
        for s in manifest.shards:  # every download within the cap
            fault_server._plans.pop("/" + s.path, None)
        after_trial(caches=[(cache, manifest)], ledger=ledger, events=["retry"])
        figures.trial(sw.s)
    per_shard = {}
    for r in fault_server.requests():
        per_shard[r.path] = per_shard.get(r.path, 0) + 1
    shard_paths = {"/" + s.path for s in manifest.shards}
    assert max(n for p, n in per_shard.items() if p in shard_paths) <= FLAKY_RUNS * (MAX_RETRIES + 1)
    assert fetches == FLAKY_RUNS * manifest.num_shards
    # waits grow exponentially: retry k waits base * 2**(k-1) (no jitter, below the cap)
    for retry, d, after in delays:
        want = min(POLICY.backoff_max, POLICY.backoff_base * 2 ** (retry - 1))
        if after is not None:
            want = max(want, min(after, POLICY.max_retry_after))
        assert d == pytest.approx(want), (retry, d, after)
    assert max(r for r, _, _ in delays) >= 2
    figures.write()


def _big_shard(tmp_path: Path, fault_server) -> tuple[Manifest, str, bytes]:
    root = tmp_path / "big"
    manifest = make_dataset(root, [700], batch_rows=100, payload=4096)  # ~2.9 MB, 3 chunks
    fault_server.put_dir(root)
    path = manifest.shards[0].path
    return Manifest.load(fault_server.url), path, fault_server.get(path)


@pytest.mark.remote
@pytest.mark.timeout(240)
def test_dropped_connections_resume_by_range(fault_server, after_trial, tmp_path: Path) -> None:
    manifest, path, data = _big_shard(tmp_path, fault_server)
    size = len(data)
    rng = random.Random(6)
    figures = Figures("6 connection dropped mid-download")
    for t in range(DROPS):
        figures.start()
        drops = rng.randrange(1, 4)
        cuts = sorted(rng.randrange(1, size) for _ in range(drops))
        # each request continues from the last one's end: cut at the next point past it
        fault_server.plan(path, *[Fault.reset(after=c - (cuts[k - 1] if k else 0))
                                  for k, c in enumerate(cuts)])
        before = len(fault_server.requests(path))
        cache_dir = tmp_path / f"c{t}"
        with Stopwatch() as sw:
            with ShardCache(manifest, cache_dir, prefetch_workers=0, retry=POLICY) as cache:
                local = cache.path(0)
                assert hash_file(local)[0] == manifest.shards[0].xxh3_128
                stats = cache.stats()
        reqs = fault_server.requests(path)[before:]
        assert len(reqs) == drops + 1 and stats.restarts == 0, (reqs, stats)
        assert reqs[0].range is None and all(r.range and r.if_range for r in reqs[1:])
        sent = sum(r.sent for r in reqs)
        assert sent <= size + drops * CHUNK, (sent, size, drops)
        assert stats.bytes_fetched == size  # nothing written twice, nothing spliced
        after_trial(caches=[(cache_dir, manifest)])
        figures.trial(sw.s)
    figures.write()


@pytest.mark.remote
@pytest.mark.timeout(60)
def test_server_ignoring_range_restarts_from_zero(fault_server, after_trial, tmp_path: Path) -> None:
    manifest, path, data = _big_shard(tmp_path, fault_server)
    fault_server.plan(path, Fault.reset(after=len(data) // 2), Fault.ignore_range())
    with ShardCache(manifest, tmp_path / "c", prefetch_workers=0, retry=POLICY) as cache:
        assert hash_file(cache.path(0))[0] == manifest.shards[0].xxh3_128
        assert cache.stats().restarts == 1
    reqs = fault_server.requests(path)
    assert [r.status for r in reqs] == [200, 200] and reqs[1].range is not None
    after_trial(caches=[(tmp_path / "c", manifest)])


@pytest.mark.remote
@pytest.mark.timeout(60)
@pytest.mark.parametrize("honour_if_range", [True, False])
def test_object_changed_mid_download_is_never_spliced(honour_if_range: bool, after_trial,
                                                      tmp_path: Path) -> None:
    from fault_server import FaultServer

    with FaultServer(honour_if_range=honour_if_range) as server:
        manifest, path, data = _big_shard(tmp_path, server)
        changed = bytearray(data)
        changed[-100] ^= 0xFF  # same size, another version: only the hash can tell
        server.plan(path, Fault.change(after=len(data) // 3, new=bytes(changed)))
        with ShardCache(manifest, tmp_path / "c", prefetch_workers=0, retry=POLICY) as cache:
            with pytest.raises(ShardIntegrityError) as info:
                cache.path(0)
            assert info.value.shard == path
            assert cache.stats().restarts >= 1
        assert not (tmp_path / "c" / manifest.fingerprint / "shards" / "00000000.arrow").exists()
        # put the original back: the next request fetches it whole and verifies
        server.put(path, data)
        with ShardCache(manifest, tmp_path / "c", prefetch_workers=0, retry=POLICY) as cache:
            assert hash_file(cache.path(0))[0] == manifest.shards[0].xxh3_128
    after_trial(caches=[(tmp_path / "c", manifest)])


@pytest.mark.remote
@pytest.mark.timeout(60)
@pytest.mark.parametrize("status", [403, 404])
def test_refusal_fails_after_one_attempt(status: int, served, fault_server, after_trial,
                                         tmp_path: Path) -> None:
    root, manifest = served()
    figures = Figures(f"7 HTTP {status}")
    figures.start()
    path = manifest.shards[1].path
    fault_server.plan(path, *[Fault.status_code(status)] * 10)
    remote = Manifest.load(fault_server.url)
    slow = RetryPolicy(max_retries=5, backoff_base=1.0)  # a retry would show in the time
    with Stopwatch() as sw:
        with ShardCache(remote, tmp_path / "c", prefetch_workers=0, retry=slow) as cache:
            with pytest.raises(RemoteFetchError) as info:
                cache.path(1)
    assert info.value.status == status and info.value.attempts == 1  # refused: never retried
    assert len(fault_server.requests(path)) == 1
    # through the loader: the prefetcher's attempt and the reader's, nothing more
    with Stopwatch() as sw2:
        dl = DataLoader(fault_server.url,
                        cache=CacheOptions(dir=tmp_path / "d", **{"retry": slow}),
                        **KW)
        with pytest.raises(Exception) as info2:
            ids_of(dl)
        dl.close()
    assert path in str(info2.value) and f"HTTP {status}" in str(info2.value)
    assert len(fault_server.requests(path)) <= 3
    after_trial(caches=[(tmp_path / "c", remote), (tmp_path / "d", remote)])
    figures.trial(max(sw.s, sw2.s))
    figures.write()


@pytest.mark.remote
@pytest.mark.timeout(60)
def test_persistent_5xx_fails_within_the_retry_budget(served, fault_server, after_trial,
                                                      tmp_path: Path) -> None:
    root, manifest = served()
    figures = Figures("7 persistent 503")
    figures.start()
    path = manifest.shards[0].path
    fault_server.plan(path, *[Fault.status_code(503)] * 100)
    remote = Manifest.load(fault_server.url)
    policy = RetryPolicy(max_retries=4, backoff_base=0.05, jitter=0.0)
    budget_ms = sum(round(policy.delay(k) * 1000) for k in range(1, 5))
    with Stopwatch() as sw:
        with ShardCache(remote, tmp_path / "c", prefetch_workers=0, retry=policy) as cache:
            with pytest.raises(RemoteFetchError) as info:
                cache.path(0)
            waited_ms = cache.stats().backoff_ms
    assert info.value.attempts == 5 and len(fault_server.requests(path)) == 5
    assert waited_ms == budget_ms  # the whole retry budget was waited, no more, no less
    after_trial(caches=[(tmp_path / "c", remote)])
    figures.trial(sw.s)
    figures.write()
