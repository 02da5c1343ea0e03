"""Cases 8, 9 and 17 of issue 8: many readers on one cache directory, killed lock holders.

CI trial counts: case 8 runs 8 processes on a cold cache twice (full: 20 runs); case 9 kills a
lock holder 6 times, cycling over the points (full: 51); case 17 starts 16 loaders at once
twice (full: 10), as forked processes (threads would each keep an fsspec HTTP session
open: see the report).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from fault_helpers import Figures, Stopwatch, expected_ids, ids_of, make_dataset, trials
from fault_server import Fault

from stoker.cache import RetryPolicy, ShardCache
from stoker.cache.lock import FileLock
from stoker.loader import DataLoader
from stoker.manifest import Manifest, hash_file

COLD_RUNS = trials(2, 20)
KILLS = trials(6, 51)
BURSTS = trials(2, 10)
KW = dict(batch_size=8, shuffle=True, seed=8)

_READER = r"""
import json, sys
sys.path.insert(0, sys.argv[3])
from fault_helpers import ids_of
from stoker.loader import DataLoader
dl = DataLoader(sys.argv[1], cache=sys.argv[2], batch_size=8, shuffle=True, seed=8)
ids = ids_of(dl)  # every sample checked against its id: a partial read would fail here
print(json.dumps({"ids": ids, "fetches": dl._cache.stats().fetches}))
dl.close()
"""


def _shard_requests(server) -> Counter:
    return Counter(r.uri for r in server.requests() if r.uri.startswith("/shards/"))


@pytest.fixture
def nginx_dataset(nginx, tmp_path: Path):
    root = tmp_path / "ds"
    manifest = make_dataset(root, [40 + 10 * s for s in range(12)])
    return root, manifest, nginx(root)


@pytest.mark.remote
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_eight_processes_on_a_cold_cache(nginx_dataset, after_trial, tmp_path: Path) -> None:
    root, manifest, server = nginx_dataset
    expected = expected_ids(root, **KW)
    here = str(Path(__file__).resolve().parent)
    figures = Figures("8 eight processes, cold cache")
    for run in range(COLD_RUNS):
        figures.start()
        cache = tmp_path / f"c{run}"
        before = _shard_requests(server)
        with Stopwatch() as sw:
            procs = [subprocess.Popen([sys.executable, "-c", _READER, server.url, str(cache), here],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for _ in range(8)]
            outs = []
            for p in procs:
                out, err = p.communicate(timeout=300)
                assert p.returncode == 0, err[-3000:]
                outs.append(json.loads(out))
        assert all(o["ids"] == expected for o in outs)
        assert sum(o["fetches"] for o in outs) == manifest.num_shards
        served = _shard_requests(server) - before
        assert served == Counter({f"/{s.path}": 1 for s in manifest.shards}), served
        after_trial(caches=[(cache, manifest)])
        figures.trial(sw.s)
    figures.write()


@pytest.mark.remote
@pytest.mark.timeout(300)
def test_sixteen_loaders_started_at_once(nginx_dataset, after_trial, tmp_path: Path) -> None:
    root, manifest, server = nginx_dataset
    expected = expected_ids(root, **KW)
    figures = Figures("17 sixteen loaders at once")
    for burst in range(BURSTS):
        figures.start()
        cache = tmp_path / f"c{burst}"
        before = _shard_requests(server)
        ctx = multiprocessing.get_context("fork")  # torch is imported already: starts fast
        start = ctx.Barrier(16)
        outs = [tmp_path / f"b{burst}.{k}.json" for k in range(16)]
        with Stopwatch() as sw:
            procs = [ctx.Process(target=_burst_reader, args=(server.url, str(cache), start, out))
                     for out in outs]
            for p in procs:
                p.start()
            for p in procs:
                p.join(timeout=120)
        assert [p.exitcode for p in procs] == [0] * 16
        for p in procs:
            p.close()
        del start, procs
        results = [json.loads(out.read_text()) for out in outs]
        assert all(r == expected for r in results), [r for r in results if r != expected][:1]
        served = _shard_requests(server) - before
        assert served == Counter({f"/{s.path}": 1 for s in manifest.shards}), served
        after_trial(caches=[(cache, manifest)])
        figures.trial(sw.s)
    figures.write()


def _burst_reader(url: str, cache: str, start, out: Path) -> None:
    start.wait(timeout=60)
    dl = DataLoader(url, cache=cache, **KW)
    try:
        out.write_text(json.dumps(ids_of(dl)))
    finally:
        dl.close()


_HOLDER = r"""
import sys, time
from stoker.cache import RetryPolicy, ShardCache
from stoker.manifest import Manifest
cache = ShardCache(Manifest.load(sys.argv[1]), sys.argv[2], prefetch_workers=0,
                   retry=RetryPolicy(timeout=120))
if sys.argv[3] == "pin":
    with cache.pin(0):
        print("pinned", flush=True)
        time.sleep(120)
else:
    cache.path(0)
"""


@pytest.mark.remote
@pytest.mark.timeout(400)
def test_killed_lock_holder_never_blocks_the_others(served, fault_server, after_trial,
                                                    tmp_path: Path) -> None:
    root, local = served([400], payload=512)  # one ~220 KB shard
    manifest = Manifest.load(fault_server.url)
    path = manifest.shards[0].path
    size = manifest.shards[0].bytes
    rng = random.Random(9)
    points = ["before the first byte", "mid-download", "last byte", "pinned"]
    figures = Figures("9 SIGKILL the lock holder")
    for t in range(KILLS):
        figures.start()
        point = points[t % len(points)]
        cache_dir = tmp_path / f"c{t}"
        after = {"before the first byte": 0, "mid-download": rng.randrange(1, size - 1),
                 "last byte": size - 1}.get(point)
        if after is not None:
            fault_server.plan(path, Fault.stall(after=after, seconds=1.5))  # outlives the kill
        child = subprocess.Popen([sys.executable, "-c", _HOLDER, fault_server.url, str(cache_dir),
                                  "pin" if point == "pinned" else "fetch"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lock = FileLock(str(cache_dir / manifest.fingerprint / "locks" / "00000000.lock"))
        deadline = time.monotonic() + 60
        if point == "pinned":
            assert child.stdout is not None and child.stdout.readline().strip() == "pinned"
        else:
            n = len(fault_server.requests(path))
            while len(fault_server.requests(path)) == n:  # the child's request is answered
                assert time.monotonic() < deadline and child.poll() is None, child.stderr.read()
                time.sleep(0.02)
            time.sleep(0.2)  # inside the stalled response, holding the lock
        assert not lock.acquire(timeout=0), f"{point}: the child does not hold the lock"
        os.kill(child.pid, signal.SIGKILL)
        child.communicate(timeout=30)
        with Stopwatch() as sw:
            with ShardCache(manifest, cache_dir, prefetch_workers=0,
                            retry=RetryPolicy(backoff_base=0.01, timeout=5)) as cache:
                assert not list((cache_dir / manifest.fingerprint / "tmp").iterdir())  # orphans
                with cache.pin(0) as got:
                    assert hash_file(got)[0] == manifest.shards[0].xxh3_128
        fault_server._plans.pop("/" + path, None)
        after_trial(caches=[(cache_dir, manifest)])
        figures.trial(sw.s)
    figures.write()
