"""The working set against the cache: a limit that holds it fetches each shard about once per
epoch (bytes counted by the real HTTP server), and a limit below it is refused at construction
with the numbers (issue 12)."""

from __future__ import annotations

import pytest

from stoker.loader import CacheOptions, DataLoader, ReadOptions, ShuffleOptions, WorkerOptions
from stoker.loader.read.order_plan import WorkingSetError


def _dataset_bytes(manifest) -> int:  # type: ignore[no-untyped-def]
    return int(manifest.shard_bytes.sum())


def _shard_bytes_sent(server) -> int:  # type: ignore[no-untyped-def]
    return sum(r.sent for r in server.requests() if "/shards/" in r.path)


@pytest.mark.remote
@pytest.mark.parametrize("worker_mode", ["thread", "process"])
def test_a_limit_at_the_working_set_fetches_each_epoch_about_once(
        dataset, fault_server, tmp_path, worker_mode: str) -> None:
    root, manifest = dataset(n_shards=40, rows=300, blob=512, grow=0)
    fault_server.put_dir(root, "ds")
    kw = dict(batch_size=32, shuffle=ShuffleOptions(partitions=4, block_size=64), seed=5,
              num_workers=2, workers=WorkerOptions(mode=worker_mode),
              read=ReadOptions(row_major="staged"))
    probe = DataLoader(str(root), **kw)
    ws = probe._order_plan.working_set
    probe.close()
    assert ws.shards < manifest.num_shards  # the limit is below the dataset: eviction happens
    limit = ws.shard_bytes  # with process workers: theirs and the loader's windows add up
    loader = DataLoader(f"{fault_server.url}/ds",
                        cache=CacheOptions(dir=tmp_path / "c", limit=limit),
                        **kw)
    try:
        per_epoch = []
        for epoch in range(3):
            before = _shard_bytes_sent(fault_server)
            loader.set_epoch(epoch)
            assert sum(len(b["id"]) for b in loader) == manifest.num_samples
            per_epoch.append((_shard_bytes_sent(fault_server) - before) / _dataset_bytes(manifest))
    finally:
        loader.close()
    assert max(per_epoch) <= 1.1, per_epoch


def test_a_cache_limit_below_the_working_set_is_refused_at_construction(dataset, tmp_path) -> None:
    root, manifest = dataset(n_shards=20, rows=300, blob=512, grow=0)
    kw = dict(batch_size=32, shuffle=ShuffleOptions(partitions=12, block_size=64), seed=5)
    need = DataLoader(str(root), **kw)._order_plan.working_set
    limit = need.shard_bytes - 1
    with pytest.raises(WorkingSetError) as err:
        DataLoader(str(root), cache=CacheOptions(dir=tmp_path / "c", limit=limit), **kw)
    msg = str(err.value)
    assert f"{need.shards} shards live at once ({need.shard_bytes} B) > the cache limit {limit} B" in msg
    assert "partitions=12" in msg and "partitions=" in msg.split("fit")[-1] or "raise" in msg
    # the options the message names do fit
    fit = int(msg.split("partitions=")[-1].split(")")[0]) if " fits" in msg else None
    if fit is not None:
        DataLoader(str(root), cache=CacheOptions(dir=tmp_path / "c2", limit=limit),
                   **{**kw, "shuffle": ShuffleOptions(partitions=fit, block_size=64)}).close()


def test_default_partitions_fit_a_small_cache_limit(dataset, tmp_path) -> None:
    root, manifest = dataset(n_shards=20, rows=300, blob=512, grow=0)
    limit = int(manifest.shard_bytes.max()) * 6
    loader = DataLoader(str(root), batch_size=32, shuffle=True, seed=5,
                        cache=CacheOptions(dir=tmp_path / "c", limit=limit))
    try:
        assert loader._order_plan.working_set.shard_bytes <= limit
        assert sum(len(b["id"]) for b in loader) == manifest.num_samples
    finally:
        loader.close()
