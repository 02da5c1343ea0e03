"""Many processes, one cache directory: one download per shard per node, crash-safe locks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from cache_disk import disk_use
from fault_server import Fault

from stoker.cache import RetryPolicy, ShardCache
from stoker.cache.lock import FileLock
from stoker.manifest import Manifest

_READER = r"""
import json, sys
import numpy as np
from stoker.cache import ShardCache
from stoker.manifest import Manifest, hash_file
url, cache_dir, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
manifest = Manifest.load(url)
order = [int(s) for s in np.random.default_rng(seed).permutation(manifest.num_shards)]
with ShardCache(manifest, cache_dir, prefetch_workers=2) as cache:
    cache.set_future(order)
    digests = {}
    for s in order:
        with cache.pin(s) as path:
            digests[s] = hash_file(path)[0]
    print(json.dumps({"digests": digests, "fetches": cache.stats().fetches}))
"""

_PINNER = r"""
import sys, time
from stoker.cache import ShardCache
from stoker.manifest import Manifest
with ShardCache(Manifest.load(sys.argv[1]), sys.argv[2], prefetch_workers=0) as cache:
    with cache.pin(int(sys.argv[3])):
        print("pinned", flush=True)
        time.sleep(120)
"""

_FETCHER = r"""
import sys
from stoker.cache import RetryPolicy, ShardCache
from stoker.manifest import Manifest
cache = ShardCache(Manifest.load(sys.argv[1]), sys.argv[2], prefetch_workers=0,
                   retry=RetryPolicy(timeout=120))
cache.path(0)
"""


def _spawn(code: str, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.remote
def test_eight_processes_on_a_cold_cache_fetch_each_shard_once(dataset, nginx, tmp_path) -> None:
    root, manifest = dataset(n_shards=16)
    server = nginx(root)
    procs = [_spawn(_READER, server.url, tmp_path / "cache", seed) for seed in range(8)]
    outputs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
        outputs.append(json.loads(out))
    expected = {str(i): s.xxh3_128 for i, s in enumerate(manifest.shards)}
    assert all(o["digests"] == expected for o in outputs)
    assert sum(o["fetches"] for o in outputs) == 16
    served = Counter(r.uri for r in server.requests() if r.uri.startswith("/shards/"))
    assert served == Counter({f"/{s.path}": 1 for s in manifest.shards})
    assert all(r.status == 200 for r in server.requests() if r.uri.startswith("/shards/"))


def test_killed_download_releases_its_lock_and_leaves_nothing_stale(dataset, fault_server,
                                                                    tmp_path) -> None:
    root, _ = dataset(n_shards=1)
    fault_server.put_dir(root, "ds")
    url = f"{fault_server.url}/ds"
    shard = "ds/shards/00000.arrow"
    fault_server.plan(shard, Fault.stall(after=1000, seconds=60))
    cache_dir = tmp_path / "cache"
    child = _spawn(_FETCHER, url, cache_dir)
    manifest = Manifest.load(url)
    lock = FileLock(str(cache_dir / manifest.fingerprint / "locks" / "00000000.lock"))
    tmp = cache_dir / manifest.fingerprint / "tmp"
    deadline = time.monotonic() + 30
    while not (fault_server.requests(shard) and tmp.exists() and any(tmp.iterdir())):
        assert time.monotonic() < deadline and child.poll() is None, child.stderr.read()
        time.sleep(0.02)
    time.sleep(0.3)  # the child is now inside the stalled response, holding the lock
    assert not lock.acquire(timeout=0)  # the child is downloading: exclusive lock held
    os.kill(child.pid, signal.SIGKILL)
    child.communicate(timeout=30)
    assert lock.acquire(timeout=5)  # the kernel released it with the dead holder
    lock.release()
    with ShardCache(manifest, cache_dir, prefetch_workers=0,
                    retry=RetryPolicy(backoff_base=0.01)) as cache:
        assert cache.stats().repaired == 1 and not list(tmp.iterdir())  # stale part removed
        with cache.pin(0) as local:
            assert Path(local).read_bytes() == (root / "shards/00000.arrow").read_bytes()
    assert [r.status for r in fault_server.requests(shard)] == [200, 200]


def test_shard_pinned_by_another_process_is_not_evicted(dataset, tmp_path) -> None:
    root, manifest = dataset(n_shards=4, grow=0)
    size = int(manifest.shard_bytes[0])
    cache_dir = tmp_path / "cache"
    child = _spawn(_PINNER, root, cache_dir, 0)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "pinned"
        with ShardCache(manifest, cache_dir, limit=2 * size, prefetch_workers=0) as cache:
            cache.set_future([1, 2, 3])  # shard 0 is never needed here: Belady's first victim
            for s in (1, 2, 3):
                cache.path(s)
            data = Path(cache.directory, "shards", "00000000.arrow")
            assert data.exists() and cache.stats().evictions == 2
            child.kill()
            child.communicate(timeout=30)
            cache.set_future([1])
            cache.path(1)
            cache.path(2)  # room needed again: now shard 0 can go
            assert not data.exists()
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()


_BUDGETED = r"""
import sys
import numpy as np
from stoker.cache import ShardCache
from stoker.manifest import Manifest, hash_file
manifest = Manifest.load(sys.argv[1])
seq = [int(s) for s in np.random.default_rng(int(sys.argv[4])).integers(0, manifest.num_shards, 25)]
with ShardCache(manifest, sys.argv[2], limit=int(sys.argv[3]), prefetch_workers=1) as cache:
    cache.set_future(seq)
    for s in seq:
        with cache.pin(s) as path:
            assert hash_file(path)[0] == manifest.shards[s].xxh3_128
"""


def test_processes_share_one_budget(dataset, tmp_path) -> None:
    import threading

    root, manifest = dataset(n_shards=10, rows=600)
    largest = int(manifest.shard_bytes.max())
    limit, allowance = 5 * largest, 2 * largest  # the default allowance
    cache_dir = tmp_path / "cache"
    samples: list[tuple[int, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(disk_use(cache_dir / manifest.fingerprint))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        procs = [_spawn(_BUDGETED, root, cache_dir, limit, seed) for seed in range(4)]
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-3000:]
    finally:
        stop.set()
        sampler.join()
    assert len(samples) > 20
    assert max(c for c, _ in samples) <= limit
    assert max(t for _, t in samples) <= limit + allowance
