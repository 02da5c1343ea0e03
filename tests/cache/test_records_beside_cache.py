"""Row-major records of a cached dataset live beside the shard cache (``<cache_dir>/row-major``)
and neither disturb the cache nor change a batch."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))

from stoker.cache import ShardCache  # noqa: E402
from stoker.loader import DataLoader, ReadOptions  # noqa: E402
from stoker.manifest import Manifest  # noqa: E402


def _epoch(loader: DataLoader) -> list[tuple[int, float, bytes]]:
    rows = []
    for batch in loader:
        rows += zip(batch["id"].tolist(), batch["x"].tolist(), map(bytes, batch["blob"]))
    return rows


def test_records_of_a_cached_dataset_live_beside_the_cache(dataset, fault_server, tmp_path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STOKER_ROW_MAJOR_DIR", raising=False)  # the default location
    root, _ = dataset(n_shards=3)
    fault_server.put_dir(root, "ds")
    url = f"{fault_server.url}/ds"
    manifest = Manifest.load(url)
    # natural order reads through per-shard records; shuffled reads stage rounds in memory and
    # leave no derived files (test_staged_reads_of_a_cached_dataset_leave_no_derived_files)
    kw = dict(batch_size=64, shuffle=False, seed=2)
    local = DataLoader(str(root), read=ReadOptions(row_major=False), **kw)
    expected = _epoch(local)
    local.close()
    cache_dir = tmp_path / "c"
    for run in range(2):  # builds and saves the records, then maps them
        # row_major=True builds each shard's records as it opens (the default builds them in
        # the background and skips a shard already closed again: timing-dependent)
        loader = DataLoader(url, read=ReadOptions(row_major=True), cache=cache_dir, **kw)
        try:
            assert _epoch(loader) == expected
            loader._source.wait_row_major()
            stats = loader._cache.stats()
        finally:
            loader.close()
        assert stats.quarantines == 0
        records = sorted((cache_dir / "row-major").glob("*.rec"))
        assert len(records) == 3, run  # one per shard, nothing inside the dataset's cache
    # the cache still verifies and accounts for exactly its own shards
    with ShardCache(manifest, cache_dir, prefetch_workers=0) as cache:
        s = cache.stats()
        assert s.quarantines == 0
    assert not any(p.name == "row-major" for p in (cache_dir / manifest.fingerprint).iterdir())
    assert np.all([f.stat().st_size > 16 for f in records])


def test_staged_reads_of_a_cached_dataset_leave_no_derived_files(dataset, fault_server, tmp_path,
                                                                 monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    monkeypatch.delenv("STOKER_ROW_MAJOR_DIR", raising=False)
    root, _ = dataset(n_shards=3)
    fault_server.put_dir(root, "ds")
    kw = dict(batch_size=64, shuffle=True, seed=2)
    local = DataLoader(str(root), read=ReadOptions(row_major=False), **kw)
    expected = _epoch(local)
    local.close()
    cache_dir = tmp_path / "c"
    loader = DataLoader(f"{fault_server.url}/ds", read=ReadOptions(row_major="staged"),
                        cache=cache_dir, **kw)
    try:
        assert loader._source.stager is not None
        assert _epoch(loader) == expected
        assert loader._cache.stats().quarantines == 0
    finally:
        loader.close()
    assert not (cache_dir / "row-major").exists() or not any((cache_dir / "row-major").iterdir())
