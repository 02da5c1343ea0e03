"""Bit rot in a cached shard: bytes that change on disk while size, mtime and inode stay.

The sidecar vouches for a cached file by size and mtime, which such a change keeps, so only a
re-hash of the content sees it. Every case flips one byte of a committed file in place and
restores its mtime, then checks on the server's side of the wire that the cache fetched that
shard again (once) and served the origin's bytes.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from fault_server import FaultServer

from stoker.cache import RetryPolicy, ShardCache
from stoker.loader import DataLoader
from stoker.manifest import Manifest, ShardIntegrityError

FAST = RetryPolicy(max_retries=2, backoff_base=0.01, backoff_max=0.05, timeout=5.0)


def _serve(dataset, server: FaultServer, **kw) -> tuple[Path, Manifest]:
    root, _ = dataset(**kw)
    server.put_dir(root, "ds")
    return root, Manifest.load(f"{server.url}/ds")


def _gets(server: FaultServer, manifest: Manifest, i: int) -> int:
    """Successful GETs of shard ``i`` the server answered."""
    path = f"ds/{manifest.shards[i].path}"
    return sum(1 for r in server.requests(path) if r.status in (200, 206))


def _rot(path: Path, offset: int) -> bytes:
    """Flip one bit of ``path`` in place and restore its mtime; returns the rotten bytes."""
    before = path.stat()
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x01]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    # Exactly what size+mtime (and the in-process inode cache) cannot see.
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino, before.st_size, before.st_mtime_ns)
    return path.read_bytes()


def _blob_offset(path: Path, value: int) -> int:
    """Offset of a byte inside the blob payload ``bytes([value]) * 64`` (a sample's data)."""
    at = path.read_bytes().find(bytes([value]) * 64)
    assert at >= 0, f"no blob of {value} in {path}"
    return at + 10


@pytest.mark.parametrize("reopen", [False, True], ids=["same-cache", "new-cache"])
def test_rotten_cached_shard_is_refetched_on_open(dataset, fault_server, tmp_path,
                                                  reopen: bool) -> None:
    root, manifest = _serve(dataset, fault_server, n_shards=3)
    origin = fault_server.get(f"ds/{manifest.shards[1].path}")
    cache = ShardCache(manifest, tmp_path / "c", retry=FAST, prefetch_workers=0)
    try:
        for i in range(3):
            with cache.pin(i):
                pass
        local = Path(cache.directory, "shards", f"{1:08d}.arrow")
        rotten = _rot(local, len(origin) // 2)
        if reopen:  # a warm restart: the sidecar still vouches, start-up repair sees nothing
            cache.close()
            cache = ShardCache(manifest, tmp_path / "c", retry=FAST, prefetch_workers=0)
            assert (cache.stats().repaired, cache.stats().quarantines) == (0, 0)
        before = cache.stats()
        with cache.pin(1) as path:
            assert Path(path).read_bytes() == origin
        assert _gets(fault_server, manifest, 1) == 2  # fetched again, once
        with cache.pin(1) as path:  # the fresh copy is served without another fetch
            assert Path(path).read_bytes() == origin
        with cache.pin(0), cache.pin(2):  # intact shards: re-hashed, never fetched again
            pass
        s = cache.stats()
        assert (s.quarantines - before.quarantines, s.fetches - before.fetches,
                s.misses - before.misses, s.hits - before.hits) == (1, 1, 1, 3)
        assert [_gets(fault_server, manifest, i) for i in range(3)] == [1, 2, 1]
        kept = list(Path(cache.directory, "quarantine").iterdir())
        assert [p.read_bytes() for p in kept] == [rotten]  # set aside for inspection
    finally:
        cache.close()


def test_rotten_shard_with_a_corrupt_origin_is_an_integrity_error(dataset, fault_server,
                                                                  tmp_path) -> None:
    _, manifest = _serve(dataset, fault_server, n_shards=2)
    name = f"ds/{manifest.shards[0].path}"
    good = fault_server.get(name)
    with ShardCache(manifest, tmp_path / "c", retry=FAST, prefetch_workers=0) as cache:
        cache.path(0)
        _rot(Path(cache.directory, "shards", f"{0:08d}.arrow"), len(good) // 3)
        bad = bytearray(good)
        bad[len(good) // 2] ^= 0xFF
        fault_server.put(name, bytes(bad))
        for _ in range(2):  # the second request re-raises without downloading again
            with pytest.raises(ShardIntegrityError, match="failed verification twice") as err:
                cache.path(0)
            assert err.value.shard == manifest.shards[0].path
        assert _gets(fault_server, manifest, 0) == 1 + 2
        assert cache.stats().quarantines == 3  # the rotten copy, then both bad downloads
        assert not Path(cache.directory, "shards", f"{0:08d}.arrow").exists()


def test_rotten_materialised_zstd_shard_is_refetched(dataset, fault_server, tmp_path) -> None:
    _, manifest = _serve(dataset, fault_server, n_shards=2, compression="zstd", blob=256)
    with ShardCache(manifest, tmp_path / "c", retry=FAST, prefetch_workers=0) as cache:
        with cache.pin(1) as path:
            materialised = Path(path).read_bytes()
        # Checked against the local hash its sidecar recorded, not the manifest's (compressed).
        _rot(Path(path), _blob_offset(Path(path), 5))
        with cache.pin(1) as again:
            assert Path(again).read_bytes() == materialised
        assert _gets(fault_server, manifest, 1) == 2
        assert (cache.stats().quarantines, cache.stats().fetches) == (1, 2)


def _epoch(loader: DataLoader) -> list[tuple[int, float, bytes]]:
    rows = []
    for batch in loader:
        rows += zip(batch["id"].tolist(), batch["x"].tolist(), map(bytes, batch["blob"]))
    return rows


def test_loader_serves_the_origin_bytes_after_bit_rot(dataset, fault_server, tmp_path) -> None:
    root, manifest = _serve(dataset, fault_server, n_shards=3)
    kw = dict(batch_size=64, shuffle=True, seed=5)
    local = DataLoader(str(root), **kw)  # the origin's bytes, read in place
    expected = _epoch(local)
    local.close()
    cold = DataLoader(fault_server.url + "/ds", cache=tmp_path / "c", **kw)
    assert _epoch(cold) == expected
    cold.close()
    # Shard 2 holds ids 807..1220; the blob of id 1011 is bytes([1011 % 251]) * 64.
    shard = Path(tmp_path, "c", manifest.fingerprint, "shards", f"{2:08d}.arrow")
    _rot(shard, _blob_offset(shard, 1011 % 251))
    warm = DataLoader(fault_server.url + "/ds", cache=tmp_path / "c", **kw)
    try:
        assert _epoch(warm) == expected  # the rotten blob was never served
        s = warm._cache.stats()
    finally:
        warm.close()
    assert (s.quarantines, s.fetches) == (1, 1)
    assert [_gets(fault_server, manifest, i) for i in range(3)] == [1, 1, 2]
    again = DataLoader(fault_server.url + "/ds", cache=tmp_path / "c", **kw)
    try:
        assert _epoch(again) == expected  # the fresh copy, from the cache
        s = again._cache.stats()
    finally:
        again.close()
    assert (s.quarantines, s.fetches, s.misses) == (0, 0, 0)
    assert [_gets(fault_server, manifest, i) for i in range(3)] == [1, 1, 2]


def test_rotten_shard_pinned_elsewhere_is_replaced_once_the_pin_is_released(
        dataset, fault_server, tmp_path) -> None:
    # Two cache objects on one directory hold separate flocks, exactly like two processes.
    _, manifest = _serve(dataset, fault_server, n_shards=2)
    origin = fault_server.get(f"ds/{manifest.shards[1].path}")
    with ShardCache(manifest, tmp_path / "c", retry=FAST, prefetch_workers=0) as a, \
            ShardCache(manifest, tmp_path / "c", retry=FAST, prefetch_workers=0) as b:
        served: list[bytes] = []
        with a.pin(1) as held:
            _rot(Path(held), len(origin) // 2)
            reader = threading.Thread(target=lambda: served.append(Path(b.path(1)).read_bytes()))
            reader.start()
            reader.join(0.5)
            # b saw the rot but may not move a file another reader holds: it waits.
            assert reader.is_alive() and served == []
            assert _gets(fault_server, manifest, 1) == 1
        reader.join(10)
        assert served == [origin]
        assert _gets(fault_server, manifest, 1) == 2
        assert (b.stats().quarantines, b.stats().fetches) == (1, 1)
