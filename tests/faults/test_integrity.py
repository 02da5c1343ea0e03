"""Cases 1, 2 and 4 of issue 8: corrupt shards (remote and cached) and dirty cache directories.

CI trial counts (``bench/faults_report.py`` scales them to the issue's): bit flips 12 remote +
12 cached (full: 100 + 100 = 200), truncations 8 remote + 8 cached (full: 50 + 50), one dirty
cache per kind of dirt.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from fault_helpers import Figures, Stopwatch, expected_ids, ids_of, trials

from stoker.loader import DataLoader
from stoker.manifest import ShardIntegrityError, StokerError

FLIPS = trials(12, 100)
CUTS = trials(8, 50)
KW = dict(batch_size=8, shuffle=True, seed=3)


def _consume_until_error(dl: DataLoader) -> tuple[list[int], BaseException | None]:
    """Ids of every batch yielded (each checked intact) and the error that stopped it."""
    got: list[int] = []
    try:
        for b in dl:
            got.extend(ids_of([b]))
    except StokerError as exc:
        return got, exc
    return got, None


def _bad_copies(data: bytes, rng: random.Random) -> list[tuple[str, bytes]]:
    """The truncations and extensions of case 2."""
    n = len(data)
    return [("empty", b""), ("one byte", data[:1]), ("mid-header", data[:8]),
            ("random", data[:rng.randrange(9, n - 1)]), ("size-1", data[:-1]),
            ("junk byte", data + b"\x00")]


def _remote_corruption(served, fault_server, after_trial, tmp_path, name: str, count: int,
                       corrupt) -> None:
    root, manifest = served()
    figures = Figures(name)
    rng = random.Random(name)
    for t in range(count):
        figures.start()
        s = rng.randrange(manifest.num_shards)
        path = manifest.shards[s].path
        good = fault_server.get(path)
        bad = corrupt(good, rng, t)
        fault_server.put(path, bad)
        before = len(fault_server.requests(path))
        cache = tmp_path / f"c{t}"
        try:
            with Stopwatch() as sw:
                dl = DataLoader(fault_server.url, cache=cache, **KW)
                got, exc = _consume_until_error(dl)
                dl.close()
        finally:
            fault_server.put(path, good)
        assert exc is not None, f"trial {t}: a corrupt shard {path} was read without an error"
        # the typed error reaches the user as itself (catchable as ShardIntegrityError)
        assert isinstance(exc, ShardIntegrityError) and exc.shard == path, repr(exc)
        assert path in str(exc)
        assert len(fault_server.requests(path)) - before == 2  # fetched again once, no more
        assert set(got) <= set(range(int(manifest.shard_rows.sum())))
        quarantined = os.listdir(cache / manifest.fingerprint / "quarantine")
        assert len(quarantined) <= 2
        after_trial(caches=[(cache, manifest)])
        figures.trial(sw.s)
    figures.write()


def _cached_corruption(served, fault_server, after_trial, tmp_path, name: str, count: int,
                       corrupt, events: list[str]) -> None:
    root, manifest = served()
    expected = expected_ids(root, **KW)
    figures = Figures(name)
    rng = random.Random(name)
    for t in range(count):
        figures.start()
        cache = tmp_path / f"c{t}"
        dl = DataLoader(fault_server.url, cache=cache, **KW)
        assert ids_of(dl) == expected
        dl.close()
        s = rng.randrange(manifest.num_shards)
        local = cache / manifest.fingerprint / "shards" / f"{s:08d}.arrow"
        local.write_bytes(corrupt(local.read_bytes(), rng, t))
        before = len(fault_server.requests(manifest.shards[s].path))
        ledger = tmp_path / f"l{t}.ledger"
        with Stopwatch() as sw:
            dl = DataLoader(fault_server.url, ledger=ledger, cache=cache, **KW)
            assert ids_of(dl) == expected  # every sample intact, none missing, same order
            stats = dl._cache.stats()
            dl.close()
        assert stats.fetches == 1, stats  # the damaged shard again, once
        assert len(fault_server.requests(manifest.shards[s].path)) == before + 1
        after_trial(caches=[(cache, manifest)], ledger=ledger, events=events)
        figures.trial(sw.s)
    figures.write()


def _flip(data: bytes, rng: random.Random, t: int) -> bytes:
    bit = rng.randrange(len(data) * 8)
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


@pytest.mark.remote
@pytest.mark.timeout(180)
def test_bit_flip_in_the_remote_copy_is_an_integrity_error(served, fault_server, after_trial,
                                                            tmp_path: Path) -> None:
    _remote_corruption(served, fault_server, after_trial, tmp_path, "1 bit flip (remote)",
                       FLIPS, _flip)


@pytest.mark.remote
@pytest.mark.timeout(180)
def test_bit_flip_in_the_cached_copy_is_quarantined_and_fetched_again(
        served, fault_server, after_trial, tmp_path: Path) -> None:
    _cached_corruption(served, fault_server, after_trial, tmp_path, "1 bit flip (cached)",
                       FLIPS, _flip, ["quarantine"])


def _cut(data: bytes, rng: random.Random, t: int) -> bytes:
    return _bad_copies(data, rng)[t % 6][1]


@pytest.mark.remote
@pytest.mark.timeout(180)
def test_truncated_remote_copy_is_an_integrity_error(served, fault_server, after_trial,
                                                     tmp_path: Path) -> None:
    _remote_corruption(served, fault_server, after_trial, tmp_path, "2 truncation (remote)",
                       max(CUTS, 6), _cut)


@pytest.mark.remote
@pytest.mark.timeout(180)
def test_truncated_cached_copy_is_repaired(served, fault_server, after_trial,
                                           tmp_path: Path) -> None:
    _cached_corruption(served, fault_server, after_trial, tmp_path, "2 truncation (cached)",
                       max(CUTS, 6), _cut, ["repair"])


@pytest.mark.remote
@pytest.mark.timeout(120)
def test_dirty_cache_is_repaired_at_start(served, fault_server, after_trial,
                                          tmp_path: Path) -> None:
    root, manifest = served()
    figures = Figures("4 dirty cache")
    figures.start()
    expected = expected_ids(root, **KW)
    cache = tmp_path / "cache"
    dl = DataLoader(fault_server.url, cache=cache, **KW)
    assert ids_of(dl) == expected
    dl.close()
    d = cache / manifest.fingerprint
    shards = sorted((d / "shards").iterdir())
    (d / "tmp" / f"{0:08d}.{manifest.shards[0].bytes}.999999.part").write_bytes(b"partial")
    (d / "tmp" / "leftover.bin").write_bytes(b"?")
    shards[1].write_bytes(b"")                                     # zero-length
    shards[2].write_bytes(shards[3].read_bytes()[:manifest.shards[2].bytes].ljust(
        manifest.shards[2].bytes, b"\0"))                          # right size, wrong hash
    (d / "shards" / "notes.txt").write_text("foreign")              # foreign files
    (d / "shards" / "subdir").mkdir()
    (d / "meta" / f"{77:08d}.json").write_text("{}")                # orphan sidecar
    with Stopwatch() as sw:
        dl = DataLoader(fault_server.url, ledger=tmp_path / "a.ledger", cache=cache, **KW)
        assert ids_of(dl) == expected
        stats = dl._cache.stats()
        dl.close()
    assert stats.repaired >= 5 and stats.quarantines == 1 and stats.fetches == 2, stats
    assert sorted(p.name for p in (d / "shards").iterdir()) == \
        [f"{i:08d}.arrow" for i in range(manifest.num_shards)]
    assert os.listdir(d / "tmp") == []
    after_trial(caches=[(cache, manifest)], ledger=tmp_path / "a.ledger",
                events=["repair", "quarantine"])
    figures.trial(sw.s)
    figures.write()
