"""Start-up repair of a crash-dirtied cache, and zstd shards materialised for zero-copy reads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest

from stoker.cache import CacheLimitError, ShardCache
from stoker.manifest import hash_file


def test_dirty_state_is_repaired_at_start(dataset, tmp_path: Path) -> None:
    root, manifest = dataset(n_shards=5)
    cache_dir = tmp_path / "c"
    with ShardCache(manifest, cache_dir, prefetch_workers=0) as cache:
        for i in range(5):
            cache.path(i)
        d = Path(cache.directory)
    data = [d / "shards" / f"{i:08d}.arrow" for i in range(5)]
    with open(data[0], "r+b") as f:  # truncated
        f.truncate(100)
    data[1].write_bytes(b"")  # zero-length
    good = data[2].read_bytes()  # same size, wrong bytes, newer mtime
    data[2].write_bytes(bytes(len(good)))
    os.utime(data[2], ns=(1, 1))
    (d / "meta" / "00000003.json").unlink()  # committed, sidecar never written: re-hash, keep
    os.utime(data[4], ns=(2, 2))  # only the mtime changed (a copy tool): re-hash, keep
    foreign = [d / "shards" / "notes.txt", d / "shards" / "99999999.arrow", d / "tmp" / "junk",
               d / "tmp" / "00000001.123.4242.part", d / "meta" / "00000077.json",
               d / "meta" / "00000002.json.4242.tmp"]
    for path in foreign:
        path.write_bytes(b"x")
    with ShardCache(manifest, cache_dir, prefetch_workers=0) as cache:
        assert cache.stats().repaired == 3 + len(foreign)
        assert not any(p.exists() for p in foreign)
        assert sorted(p.name for p in (d / "shards").iterdir()) == [
            "00000003.arrow", "00000004.arrow"]
        for i in range(5):
            with cache.pin(i) as local:
                assert hash_file(local)[0] == manifest.shards[i].xxh3_128
        s = cache.stats()
        assert (s.fetches, s.hits) == (3, 2)


def _batches(path: str) -> list[pa.RecordBatch]:
    with pa.memory_map(path) as source:
        reader = pa.ipc.open_file(source)
        return [reader.get_batch(i) for i in range(reader.num_record_batches)]


def test_zstd_shards_are_materialised_uncompressed_and_zero_copy(dataset, tmp_path: Path) -> None:
    root, manifest = dataset(n_shards=2, compression="zstd", blob=256)
    with ShardCache(manifest, tmp_path / "c", prefetch_workers=0) as cache:
        with cache.pin(1) as local:
            source = _batches(str(root / manifest.shards[1].path))
            assert [b.num_rows for b in source] == list(manifest.shards[1].batch_rows)
            assert os.path.getsize(local) > 2 * manifest.shards[1].bytes  # really decompressed
            before = pa.total_allocated_bytes()
            with pa.memory_map(local) as mm:
                table = pa.ipc.open_file(mm).read_all()
                assert pa.total_allocated_bytes() == before  # zero-copy: no decompression
                assert table.to_batches() == source
                del table
        side = json.loads(Path(cache.directory, "meta", "00000001.json").read_text())
        assert side["materialised"] and side["source_xxh3_128"] == manifest.shards[1].xxh3_128
    with ShardCache(manifest, tmp_path / "c", prefetch_workers=0) as warm:
        warm.path(1)
        assert (warm.stats().hits, warm.stats().fetches, warm.stats().repaired) == (1, 0, 0)


def test_zstd_inflight_allowance_too_small_for_the_rewrite(dataset, tmp_path: Path) -> None:
    _, manifest = dataset(n_shards=1, compression="zstd", blob=256)
    size = int(manifest.shard_bytes[0])
    with ShardCache(manifest, tmp_path / "c", prefetch_workers=0,
                    inflight_allowance=size) as cache:
        with pytest.raises(CacheLimitError, match="inflight_allowance"):
            cache.path(0)
        assert not list(Path(cache.directory, "tmp").iterdir())
