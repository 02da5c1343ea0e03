"""HTTP downloads against a fault-injecting server: every rule checked on the wire."""

from __future__ import annotations

import base64
import logging
import time
from pathlib import Path

import pytest
from fault_server import Fault, FaultServer

from stoker.cache import RemoteFetchError, RetryPolicy, ShardCache
from stoker.manifest import Manifest, ShardIntegrityError

FAST = RetryPolicy(max_retries=4, backoff_base=0.01, backoff_max=0.05, timeout=5.0)
SHARD = "ds/shards/00000.arrow"


def _serve(server: FaultServer, root: Path, base: str | None = None) -> Manifest:
    server.put_dir(root, "ds")
    return Manifest.load(f"{base or server.url}/ds")


def _cache(manifest: Manifest, tmp_path: Path, **kw) -> ShardCache:
    kw.setdefault("retry", FAST)
    kw.setdefault("prefetch_workers", 0)
    return ShardCache(manifest, tmp_path / "cache", **kw)


def _check(cache: ShardCache, root: Path, manifest: Manifest, i: int = 0) -> None:
    with cache.pin(i) as local:
        assert Path(local).read_bytes() == (root / manifest.shards[i].path).read_bytes()


@pytest.mark.parametrize("fault", ["reset", "truncate", "stall"])
def test_interrupted_download_resumes_with_a_range_request(dataset, fault_server, tmp_path,
                                                           fault) -> None:
    root, _ = dataset(n_shards=1)
    manifest = _serve(fault_server, root)
    size = manifest.shards[0].bytes
    cut = size // 3
    make = {"reset": lambda: Fault.reset(cut), "truncate": lambda: Fault.truncate(cut),
            "stall": lambda: Fault.stall(cut, seconds=5)}[fault]
    fault_server.plan(SHARD, make())
    policy = RetryPolicy(max_retries=3, backoff_base=0.01, timeout=0.3)
    with _cache(manifest, tmp_path, retry=policy) as cache:
        _check(cache, root, manifest)
        s = cache.stats()
    reqs = fault_server.requests(SHARD)
    assert [r.status for r in reqs] == [200, 206]
    assert reqs[1].range == f"bytes={cut}-"
    assert reqs[1].if_range == dict(reqs[0].headers).get("If-Range", reqs[1].if_range)  # sent
    assert reqs[1].if_range is not None and reqs[1].if_range.startswith('"')
    assert (s.retries, s.restarts, s.quarantines) == (1, 0, 0)
    assert s.bytes_fetched == size  # nothing downloaded twice


@pytest.mark.parametrize(("status", "form"), [(503, "seconds"), (429, "http-date")])
def test_retry_after_is_honoured(dataset, fault_server, tmp_path, status, form) -> None:
    import email.utils

    root, _ = dataset(n_shards=1)
    manifest = _serve(fault_server, root)
    # An HTTP date has whole seconds and the reply is parsed a little later (more on a loaded
    # machine): 4 s ahead leaves a wait of more than 1 s with 2 s of slack.
    after = 1 if form == "seconds" else email.utils.formatdate(time.time() + 4, usegmt=True)
    fault_server.plan(SHARD, Fault.status_code(status, retry_after=after))
    with _cache(manifest, tmp_path) as cache:
        _check(cache, root, manifest)
        assert cache.stats().retries == 1
        assert cache.stats().backoff_ms >= 1000  # Retry-After, not the 0.01 s backoff
    assert [r.status for r in fault_server.requests(SHARD)] == [status, 200]


def test_retries_are_capped(dataset, fault_server, tmp_path) -> None:
    root, _ = dataset(n_shards=1)
    manifest = _serve(fault_server, root)
    fault_server.plan(SHARD, *[Fault.status_code(503)] * 10)
    policy = RetryPolicy(max_retries=3, backoff_base=0.01, backoff_max=0.02)
    with _cache(manifest, tmp_path, retry=policy) as cache:
        with pytest.raises(RemoteFetchError, match="gave up after 4 requests") as err:
            cache.path(0)
    assert err.value.status == 503 and err.value.attempts == 4
    assert len(fault_server.requests(SHARD)) == 4
    assert not list((tmp_path / "cache").rglob("*.part"))  # no partial file left behind


@pytest.mark.parametrize("status", [403, 404])
def test_forbidden_and_missing_fail_fast(dataset, fault_server, tmp_path, status) -> None:
    root, _ = dataset(n_shards=1)
    manifest = _serve(fault_server, root)
    fault_server.plan(SHARD, Fault.status_code(status))
    with _cache(manifest, tmp_path) as cache:
        with pytest.raises(RemoteFetchError) as err:
            cache.path(0)
    msg = str(err.value)
    assert f"HTTP {status}" in msg and "shards/00000.arrow" in msg and "not retried" in msg
    assert err.value.status == status
    assert len(fault_server.requests(SHARD)) == 1


def test_server_ignoring_range_restarts_without_splicing(dataset, fault_server, tmp_path) -> None:
    root, _ = dataset(n_shards=1)
    manifest = _serve(fault_server, root)
    size = manifest.shards[0].bytes
    fault_server.plan(SHARD, Fault.reset(size // 2), Fault.ignore_range())
    with _cache(manifest, tmp_path) as cache:
        _check(cache, root, manifest)
        s = cache.stats()
    reqs = fault_server.requests(SHARD)
    assert [r.status for r in reqs] == [200, 200] and reqs[1].range == f"bytes={size // 2}-"
    assert (s.restarts, s.quarantines) == (1, 0)  # whole body taken from byte 0, verified


@pytest.mark.parametrize("honour_if_range", [True, False])
def test_object_changed_mid_download_restarts_from_zero(dataset, tmp_path, honour_if_range) -> None:
    root, _ = dataset(n_shards=1)
    with FaultServer(honour_if_range=honour_if_range) as server:
        manifest = _serve(server, root)
        good = server.get(SHARD)
        stale = bytes(reversed(good))  # the previous version of the object, same size
        server.put(SHARD, stale)
        server.plan(SHARD, Fault.change(len(good) // 2, new=good))
        with _cache(manifest, tmp_path) as cache:
            _check(cache, root, manifest)
            s = cache.stats()
        statuses = [r.status for r in server.requests(SHARD)]
    # A spliced file (stale head + new tail) would fail verification and be quarantined.
    assert s.quarantines == 0 and s.restarts == 1
    assert statuses == ([200, 200] if honour_if_range else [200, 206, 200])


def test_corrupt_download_is_quarantined_and_fetched_again(dataset, fault_server, tmp_path) -> None:
    root, _ = dataset(n_shards=1)
    manifest = _serve(fault_server, root)
    fault_server.plan(SHARD, Fault.corrupt())
    with _cache(manifest, tmp_path) as cache:
        _check(cache, root, manifest)
        assert cache.stats().quarantines == 1
        assert len(list(Path(cache.directory, "quarantine").iterdir())) == 1


def test_persistent_corruption_raises_integrity_error_without_secrets(dataset, tmp_path,
                                                                      caplog) -> None:
    root, _ = dataset(n_shards=1)
    caplog.set_level(logging.DEBUG)
    secret_pw, token = "hunter2-Pa55word", "tok-SECRET-value-123"
    with FaultServer() as server:
        base = f"http://alice:{secret_pw}@127.0.0.1:{server.port}"
        manifest = _serve(server, root, base=base)
        server.plan(SHARD, Fault.corrupt(), Fault.corrupt())
        with _cache(manifest, tmp_path,
                    storage_options={"headers": {"Authorization-Token": token}}) as cache:
            with pytest.raises(ShardIntegrityError) as err:
                cache.path(0)
            stats = repr(cache.stats())
        sent = dict(server.requests(SHARD)[0].headers)
    msg = str(err.value)
    assert err.value.shard == "shards/00000.arrow"
    assert "shard 0" in msg and "127.0.0.1" in msg and "failed verification twice" in msg
    assert sent["Authorization"] == "Basic " + base64.b64encode(f"alice:{secret_pw}".encode()).decode()
    assert sent["Authorization-Token"] == token
    ours = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("stoker"))
    assert "quarantined" in ours  # our log did speak about this shard
    for text in (msg, ours, stats, repr(err.value.__cause__), repr(err.value.__context__)):
        assert secret_pw not in text and token not in text and "alice" not in text


def test_object_of_wrong_size_is_an_integrity_error(dataset, fault_server, tmp_path) -> None:
    root, _ = dataset(n_shards=1)
    manifest = _serve(fault_server, root)
    fault_server.put(SHARD, fault_server.get(SHARD) + b"extra")
    with _cache(manifest, tmp_path) as cache:
        with pytest.raises(ShardIntegrityError, match="manifest says"):
            cache.path(0)
        assert cache.stats().quarantines == 2
    assert len(fault_server.requests(SHARD)) == 2  # no body read, no retry storm


def test_failed_prefetch_is_left_to_the_foreground(dataset, fault_server, tmp_path) -> None:
    root, _ = dataset(n_shards=2)
    manifest = _serve(fault_server, root)
    missing = "ds/shards/00001.arrow"
    fault_server.plan(missing, *[Fault.status_code(404)] * 5)
    with _cache(manifest, tmp_path, prefetch_workers=2) as cache:
        cache.set_future([0, 1])
        deadline = time.monotonic() + 10
        while not fault_server.requests(missing) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)  # a prefetcher retrying in a loop would ask again and again
        assert len(fault_server.requests(missing)) == 1
        cache.path(0)
        with pytest.raises(RemoteFetchError, match="HTTP 404"):
            cache.path(1)
    assert len(fault_server.requests(missing)) == 2
