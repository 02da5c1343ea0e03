"""Derived data under the node cache's one budget (stoker.cache.store.derived): with a cache
limit, shards and the row-major record files of ``<cache dir>/row-major`` together stay within
it, measured on disk; record files go first (they can be rebuilt), shards stay; a record file
that does not fit is the counted ``records_not_saved`` fallback, never an error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from stoker.cache import ShardCache
from stoker.cache.lock import FileLock
from stoker.cache.store.derived import DerivedFiles
from stoker.loader import CacheOptions, DataLoader, ReadOptions
from stoker.manifest import Manifest

ROWS, SHARDS = 2000, 6


def _on_disk(cache_dir: Path, manifest: Manifest) -> tuple[int, int]:
    """(shard + quarantine bytes, record-file bytes incl. files being written) on disk."""
    def size(d: Path, pattern: str) -> int:
        total = 0
        for p in d.glob(pattern) if d.is_dir() else ():
            try:
                total += p.stat().st_size
            except FileNotFoundError:  # evicted while listed
                continue
        return total
    root = cache_dir / manifest.fingerprint
    shards = size(root / "shards", "*") + size(root / "quarantine", "*")
    return shards, size(cache_dir / "row-major", "*.rec")


def _records(cache_dir: Path) -> list[Path]:
    return [p for p in (cache_dir / "row-major").glob("*.rec") if not p.name.startswith(".")]


def _loader(root: Path, cache_dir: Path, limit: int, columns: list[str] | None = None
            ) -> DataLoader:
    # natural order + row_major=True: every shard's records are built as it opens and saved
    return DataLoader(str(root), batch_size=256, shuffle=False, seed=3, columns=columns,
                      cache=CacheOptions(dir=cache_dir, limit=limit),
                      read=ReadOptions(row_major=True))


def _record_bytes(manifest: Manifest, stride: int) -> list[int]:
    return [int(n) * stride + 16 for n in manifest.shard_rows]  # + xxh3 trailer


@pytest.fixture
def no_records_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STOKER_ROW_MAJOR_DIR", raising=False)  # the node cache's own dir


def test_shards_and_records_stay_within_the_limit_and_records_use_the_room(
        dataset, tmp_path: Path, no_records_env: None) -> None:
    root, manifest = dataset(n_shards=SHARDS, rows=ROWS)
    shards = int(manifest.shard_bytes.sum())
    rec = _record_bytes(manifest, 16)  # id int64 + x float32 (rounded up to 8)
    limit = shards + sum(rec) // 2  # every shard, and about half of the records
    cache_dir = tmp_path / "c"
    loader = _loader(root, cache_dir, limit)
    try:
        saved = []
        for _ in range(3):
            for _batch in loader:
                assert sum(_on_disk(cache_dir, manifest)) <= limit
            loader._source.wait_row_major()
            used_shards, used_records = _on_disk(cache_dir, manifest)
            assert used_shards + used_records <= limit, (used_shards, used_records, limit)
            saved.append(len(_records(cache_dir)))
        stats = loader._cache.stats()
    finally:
        loader.close()
    assert used_shards == shards  # every shard stayed: records never take a shard's room
    assert min(saved) >= 1 and max(saved) < SHARDS  # records use the room there is, no more
    assert stats.evictions == 0 and stats.fetches == SHARDS


def test_a_limit_too_small_for_both_keeps_the_shards(dataset, tmp_path: Path,
                                                     no_records_env: None) -> None:
    root, manifest = dataset(n_shards=SHARDS, rows=ROWS)
    shards = int(manifest.shard_bytes.sum())
    limit = shards + min(_record_bytes(manifest, 16)) // 2  # no record file fits beside them
    cache_dir = tmp_path / "c"
    reference = DataLoader(str(root), batch_size=256, shuffle=False, seed=3,
                           read=ReadOptions(row_major=False))
    expected = [b["id"].tolist() for b in reference]
    loader = _loader(root, cache_dir, limit)
    try:
        for _ in range(2):
            assert [b["id"].tolist() for b in loader] == expected  # training goes on
            loader._source.wait_row_major()
            used_shards, used_records = _on_disk(cache_dir, manifest)
            assert used_shards + used_records <= limit
        stats, fallbacks = loader._cache.stats(), loader.stats.fallbacks
    finally:
        loader.close()
    assert used_shards == shards and _records(cache_dir) == []  # shards kept, records went
    assert stats.evictions == 0 and stats.fetches == SHARDS  # no shard fetched twice
    assert fallbacks.get("records_not_saved", 0) >= 1


def test_admitting_a_shard_deletes_record_files_first(dataset, tmp_path: Path) -> None:
    _, manifest = dataset(n_shards=4, grow=0)
    size = int(manifest.shard_bytes[0])
    cache_dir = tmp_path / "c"
    records = cache_dir / "row-major"
    records.mkdir(parents=True)
    for k in range(3):  # three shards' worth of record files, oldest first
        f = records / f"r{k}.rec"
        f.write_bytes(b"\0" * size)
        os.utime(f, (1000 + k, 1000 + k))
    with ShardCache(manifest, cache_dir, limit=4 * size, prefetch_workers=0) as cache:
        for s in range(3):
            with cache.pin(s):
                pass
            assert sum(_on_disk(cache_dir, manifest)) <= 4 * size
        stats = cache.stats()
    assert sorted(p.name for p in records.iterdir()) == ["r2.rec"]  # least recent went first
    assert stats.evictions == 0 and stats.derived_evictions == 2


def test_the_budget_applies_to_the_node_caches_records_directory_only(dataset,
                                                                      tmp_path: Path) -> None:
    _, manifest = dataset(n_shards=2)
    with ShardCache(manifest, tmp_path / "c", limit="1MB", prefetch_workers=0) as cache:
        budget = cache.derived_budget(tmp_path / "c" / "row-major")
        assert budget is not None and budget.limit == 1_000_000
        assert cache.derived_budget(tmp_path / "elsewhere") is None
    with ShardCache(manifest, tmp_path / "c", prefetch_workers=0) as cache:
        assert cache.derived_budget(tmp_path / "c" / "row-major") is None  # no limit


def test_a_record_file_being_written_counts_and_goes_before_a_shard(dataset,
                                                                   tmp_path: Path) -> None:
    _, manifest = dataset(n_shards=3, grow=0)
    size = int(manifest.shard_bytes[0])
    cache_dir = tmp_path / "c"
    records = cache_dir / "row-major"
    records.mkdir(parents=True)
    writer = FileLock(str(records / "a.rec.lock"))  # a live writer of a.rec
    assert writer.acquire(timeout=0)
    writing = records / f".writing-{size}.a.rec.k2x9.rec"  # empty yet, reserving its size
    orphan = records / f".writing-{size}.b.rec.q7z1.rec"  # its writer was killed
    writing.touch()
    orphan.touch()
    try:
        with ShardCache(manifest, cache_dir, limit=3 * size, prefetch_workers=0) as cache:
            for s in range(2):  # the reservation fits beside two shards
                with cache.pin(s):
                    pass
            assert writing.exists() and not orphan.exists()
            with cache.pin(2):  # a third needs the room: the write in progress goes, no shard
                pass
            stats = cache.stats()
    finally:
        writer.release()
    assert not writing.exists()
    assert stats.evictions == 0 and stats.derived_evictions == 1


_NAME = "abc.k1.rec"


@pytest.fixture
def writing(tmp_path: Path) -> Iterator[tuple[DerivedFiles, str]]:
    """A records directory with one file being written (5,000 bytes, reserved and written)
    by a live writer (its lock held: not an orphan): ``(files, temp path)``."""
    files = DerivedFiles(str(tmp_path))
    writer = FileLock(str(tmp_path / f"{_NAME}.lock"))
    assert writer.acquire(timeout=0)
    try:
        temp = files.temp(_NAME, 5000)
        Path(temp).write_bytes(b"x" * 5000)
        yield files, temp
    finally:
        writer.release()


def test_a_write_published_after_the_scan_is_deleted_as_its_record_file(
        writing: tuple[DerivedFiles, str], tmp_path: Path) -> None:
    """Eviction lists a file being written; its writer (holding no budget lock) renames it to
    its record file before the eviction deletes it: the record file goes, so the bytes
    counted as freed are freed."""
    files, temp = writing
    records, listed = files.scan()
    assert records == [] and [size for _, size, _ in listed] == [5000]
    os.replace(temp, tmp_path / _NAME)  # published between the scan and the eviction
    assert files.evict(5000, 10, 5000, listed) == (0, 1)
    assert not (tmp_path / _NAME).exists() and not Path(temp).exists()


def test_a_write_published_while_listed_still_counts(writing: tuple[DerivedFiles, str],
                                                     tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A file being written that its writer publishes between the directory's listing and
    the look at the file counts as its record file, not as nothing."""
    files, temp = writing
    real = os.scandir

    def listed_then_published(path: str) -> list[os.DirEntry[str]]:
        entries = list(real(path))
        os.replace(temp, tmp_path / _NAME)  # the writer publishes right after the listing
        return entries

    monkeypatch.setattr("stoker.cache.store.derived.os.scandir", listed_then_published)
    records, listed = files.scan()
    assert listed == [] and [(size, path) for _, size, path in records] == \
        [(5000, str(tmp_path / _NAME))]


_RUN = r"""
import json, sys
from pathlib import Path
from stoker.loader import CacheOptions, DataLoader, ReadOptions
root, cache_dir, limit, fp, cols = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
def used():
    total = 0
    for d, pat in ((cache_dir / fp / "shards", "*"), (cache_dir / fp / "quarantine", "*"),
                   (cache_dir / "row-major", "*.rec")):
        for p in d.glob(pat):
            try:
                total += p.stat().st_size
            except FileNotFoundError:
                pass
    return total
loader = DataLoader(root, batch_size=256, shuffle=False, seed=3, columns=cols.split(","),
                    cache=CacheOptions(dir=cache_dir, limit=limit), read=ReadOptions(row_major=True))
seen = []
for epoch in range(3):
    for batch in loader:
        seen.append(used())
    loader._source.wait_row_major()
    seen.append(used())
loader.close()
print(json.dumps(seen))
"""


def test_two_processes_sharing_a_cache_stay_under_the_limit_together(
        dataset, tmp_path: Path) -> None:
    root, manifest = dataset(n_shards=SHARDS, rows=ROWS)
    shards = int(manifest.shard_bytes.sum())
    rec = _record_bytes(manifest, 8)  # each process: one 8-byte output (its own layout)
    limit = shards + sum(rec)  # every shard, and half of the two processes' records
    cache_dir = tmp_path / "c"
    env = {k: v for k, v in os.environ.items() if k != "STOKER_ROW_MAJOR_DIR"}
    procs = [subprocess.Popen([sys.executable, "-c", _RUN, str(root), str(cache_dir),
                               str(limit), manifest.fingerprint, cols],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for cols in ("id", "x")]
    seen: list[int] = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        seen += json.loads(out.strip().splitlines()[-1])
    used_shards, used_records = _on_disk(cache_dir, manifest)
    assert max(seen) <= limit and used_shards + used_records <= limit, (max(seen), limit)
    assert used_shards == shards and 1 <= len(_records(cache_dir)) < 2 * SHARDS
    assert np.all([p.stat().st_size in set(rec) for p in _records(cache_dir)])
