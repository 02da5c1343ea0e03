"""Several prefetch threads fetch each shard once: counted on the server's side of the wire."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
from fault_server import FaultServer

from stoker.cache import RetryPolicy, ShardCache
from stoker.manifest import Manifest

FAST = RetryPolicy(max_retries=4, backoff_base=0.01, backoff_max=0.05, timeout=5.0)


def _served(dataset, server: FaultServer, n: int) -> tuple[Manifest, int]:
    root, _ = dataset(n_shards=n, grow=0)
    server.put_dir(root, "ds")
    manifest = Manifest.load(f"{server.url}/ds")
    sizes = set(manifest.shard_bytes.tolist())
    assert len(sizes) == 1
    return manifest, sizes.pop()


def _gets(server: FaultServer) -> Counter[str]:
    return Counter(r.path.rsplit("/", 1)[-1] for r in server.requests()
                   if "/shards/" in r.path and r.status in (200, 206))


@pytest.mark.parametrize("workers", [2, 4])
@pytest.mark.parametrize("round_", range(6))
def test_each_shard_is_fetched_once_with_several_prefetch_threads(
        dataset, fault_server: FaultServer, tmp_path: Path, workers: int, round_: int) -> None:
    # The budget holds 3 of 6 shards and the prefetchers look at all 6: they must fill the
    # cache with the 3 needed first and never fetch a later shard into room an earlier one
    # is about to take (it would be evicted again when that one lands, then fetched again).
    manifest, size = _served(dataset, fault_server, 12)
    order = list(range(12))
    with ShardCache(manifest, tmp_path / "c", limit=3 * size, retry=FAST,
                    prefetch_workers=workers, prefetch_ahead=6) as cache:
        cache.set_future(order)
        deadline = time.monotonic() + 10
        while cache.stats().prefetches < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.1)  # room for a wrongly eager prefetcher to fetch and evict
        assert sorted(int(p.stem) for p in Path(cache.directory, "shards").iterdir()) == [0, 1, 2]
        for s in order:
            with cache.pin(s):
                pass
        stats = cache.stats()
    gets = _gets(fault_server)
    assert gets == {f"{s:05d}.arrow": 1 for s in order}
    assert (stats.fetches, stats.evictions, stats.hits + stats.misses) == (12, 9, 12)
