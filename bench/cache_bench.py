"""Shard cache benchmark: cold vs warm epochs from a loopback S3 server, Belady vs LRU.

Run: ``.venv/bin/python bench/cache_bench.py [--shards 48 --shard-mb 4 --repeats 3]``

1. Throughput. The same shuffled epoch of shards is consumed (pin + read every byte) four
   ways, interleaved in every repeat: straight from S3 with ``s3fs.cat_file`` (baseline, no
   cache), a cold :class:`ShardCache` without and with prefetching (download + verify +
   commit), and a warm cache (a new process-level cache object over the filled directory: the
   warm-restart path, sidecars trusted, nothing fetched). Medians over repeats.
2. Hit rate at ``limit`` = 50 % of the dataset over 3 epochs, each epoch's shard order from
   ``stoker.loader.order.epoch.EpochOrder.shard_sequence`` (a seeded permutation if the loader is not
   importable): Belady vs LRU eviction without prefetching (pure policy), and both with
   prefetching. The textbook OPT/LRU miss counts for the same sequence are printed beside them.

Needs the test extra (moto[server], s3fs). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from stoker.cache import ShardCache
from stoker.manifest import Manifest, ShardInfo, hash_file


def build_dataset(root: Path, shards: int, shard_mb: float) -> Manifest:
    """Incompressible binary rows, ~``shard_mb`` MiB per shard, 4 record batches each."""
    rng = np.random.default_rng(0)
    schema = pa.schema([("id", pa.int64()), ("payload", pa.binary())])
    row_bytes = 4096
    rows = max(4, int(shard_mb * (1 << 20) / row_bytes))
    (root / "shards").mkdir(parents=True)
    infos = []
    for s in range(shards):
        rel = f"shards/{s:05d}.arrow"
        per = [rows // 4] * 3 + [rows - 3 * (rows // 4)]
        with pa.OSFile(str(root / rel), "wb") as sink, pa.ipc.new_file(sink, schema) as w:
            base = s * rows
            for count in per:
                blob = rng.bytes(count * row_bytes)
                payload = pa.array([blob[k * row_bytes:(k + 1) * row_bytes] for k in range(count)],
                                   pa.binary())
                w.write_batch(pa.record_batch([pa.array(np.arange(base, base + count)), payload],
                                              schema=schema))
                base += count
        digest, size = hash_file(root / rel)
        infos.append(ShardInfo(rel, rows, size, digest, tuple(per)))
    m = Manifest.create(schema=schema, shards=infos, sources=[], options={"bench": "cache"},
                        stoker_version="bench")
    m.save(root)
    return m


def epoch_orders(manifest: Manifest, epochs: int, seed: int) -> tuple[list[list[int]], str]:
    try:
        from stoker.loader.order.epoch import EpochOrder, OrderOptions

        out = []
        for e in range(epochs):
            order = EpochOrder(manifest.shard_rows, manifest.fingerprint, seed, e, OrderOptions())
            out.append([int(s) for s in order.shard_sequence(0, manifest.num_samples)])
        return out, "EpochOrder.shard_sequence (P=8, redraw)"
    except ImportError:
        rng = np.random.default_rng(seed)
        return [[int(s) for s in rng.permutation(manifest.num_shards)] for _ in range(epochs)], \
            "seeded numpy permutation"


def consume(cache: ShardCache, order: list[int]) -> int:
    """Pin and read every byte of each shard in ``order``; returns bytes read."""
    total = 0
    for s in order:
        with cache.pin(s) as path, open(path, "rb") as f:
            while chunk := f.read(8 << 20):
                total += len(chunk)
    return total


def start_s3() -> tuple[Any, dict[str, Any]]:
    """moto's S3 server in its own process (in-process, it would compete for our GIL)."""
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    binary = Path(sys.executable).with_name("moto_server")
    server = subprocess.Popen([str(binary), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        if time.monotonic() > deadline or server.poll() is not None:
            raise RuntimeError("moto_server did not start")
        time.sleep(0.05)
    opts = {"key": "bench", "secret": "bench", "skip_instance_cache": True,
            "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}",
                              "region_name": "us-east-1"}}
    return server, opts


def upload(root: Path, opts: dict[str, Any]) -> str:
    import boto3

    client = boto3.client("s3", aws_access_key_id=opts["key"], aws_secret_access_key=opts["secret"],
                          **opts["client_kwargs"])
    client.create_bucket(Bucket="bench")
    for path in sorted(root.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), "bench", f"ds/{path.relative_to(root).as_posix()}")
    return "s3://bench/ds"


def timed(fn: Callable[[], int]) -> tuple[float, int]:
    t0 = time.perf_counter()
    n = fn()
    return time.perf_counter() - t0, n


def throughput(manifest: Manifest, opts: dict[str, Any], work: Path, order: list[int],
               repeats: int) -> dict[str, list[float]]:
    import s3fs

    fs = s3fs.S3FileSystem(**opts)
    results: dict[str, list[float]] = {k: [] for k in
                                       ("s3fs cat_file, no cache", "s3fs get_file to disk",
                                        "cold, no prefetch", "cold, prefetch 2", "warm restart")}

    def direct() -> int:
        return sum(len(fs.cat_file(manifest.shard_location(s).removeprefix("s3://")))
                   for s in order)

    def naive() -> int:  # what a cache without verify/budget/locks would do
        (work / "naive").mkdir(exist_ok=True)
        for s in order:
            fs.get_file(manifest.shard_location(s).removeprefix("s3://"), str(work / "naive" / str(s)))
        return 0

    for _ in range(repeats):
        results["s3fs cat_file, no cache"].append(timed(direct)[0])
        shutil.rmtree(work / "naive", ignore_errors=True)
        results["s3fs get_file to disk"].append(timed(naive)[0])
        for name, workers in (("cold, no prefetch", 0), ("cold, prefetch 2", 2)):
            shutil.rmtree(work / "cache", ignore_errors=True)
            with ShardCache(manifest, work / "cache", storage_options=opts,
                            prefetch_workers=workers) as cache:
                cache.set_future(order)
                results[name].append(timed(lambda: consume(cache, order))[0])
        with ShardCache(manifest, work / "cache", storage_options=opts,
                        prefetch_workers=2) as warm:
            warm.set_future(order)
            results["warm restart"].append(timed(lambda: consume(warm, order))[0])
            if warm.stats().misses:
                raise RuntimeError("warm epoch fetched: the cache directory was not reused")
    return results


def reference_misses(seq: list[int], capacity: int, policy: str) -> int:
    """Textbook demand paging with equal-size pages (for the side-by-side column)."""
    nxt_pos: list[float] = [math.inf] * len(seq)
    last: dict[int, int] = {}
    for p in range(len(seq) - 1, -1, -1):
        nxt_pos[p] = last.get(seq[p], math.inf)
        last[seq[p]] = p
    cached: dict[int, float] = {}  # shard -> next use (OPT) or last use (LRU)
    misses = 0
    for p, s in enumerate(seq):
        if s not in cached:
            misses += 1
            if len(cached) == capacity:
                pick = max if policy == "opt" else min
                del cached[pick(cached, key=cached.__getitem__)]
        cached[s] = nxt_pos[p] if policy == "opt" else p
    return misses


def hit_rates(manifest: Manifest, opts: dict[str, Any], work: Path,
              seq: list[int]) -> list[tuple[str, float, int, int]]:
    limit = int(manifest.shard_bytes.sum()) // 2
    rows = []
    for policy, workers in (("belady", 0), ("lru", 0), ("belady", 2), ("lru", 2)):
        shutil.rmtree(work / "cache", ignore_errors=True)
        with ShardCache(manifest, work / "cache", storage_options=opts, limit=limit,
                        prefetch_workers=workers, eviction=policy) as cache:
            cache.set_future(seq)
            consume(cache, seq)
            s = cache.stats()
        rows.append((f"{policy}, prefetch {workers}", s.hit_rate, s.misses, s.bytes_fetched))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", type=int, default=48)
    ap.add_argument("--shard-mb", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="stoker-cache-bench-"))
    server, opts = start_s3()
    try:
        local = build_dataset(work / "src", args.shards, args.shard_mb)
        url = upload(work / "src", opts)
        manifest = Manifest.load(url, opts)
        assert manifest.fingerprint == local.fingerprint
        total = int(manifest.shard_bytes.sum())
        orders, source = epoch_orders(manifest, args.epochs, args.seed)
        print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, Python "
              f"{platform.python_version()}, pyarrow {pa.__version__}; dataset {args.shards} "
              f"shards x {total / args.shards / 2**20:.1f} MiB = {total / 2**20:.0f} MiB on moto_server "
              f"S3 (loopback, own process); order: {source}\n")

        res = throughput(manifest, opts, work, orders[0], args.repeats)
        base = statistics.median(res["s3fs cat_file, no cache"])
        print("| one epoch (pin + read every byte) | median s | MB/s | shards/s | vs s3fs |")
        print("|---|---:|---:|---:|---:|")
        for name, times in res.items():
            t = statistics.median(times)
            print(f"| {name} | {t:.2f} | {total / t / 1e6:.0f} | {args.shards / t:.1f} | "
                  f"{base / t:.2f}x |")

        seq = [s for o in orders for s in o]
        capacity = args.shards // 2
        print(f"\nlimit = 50 % of the dataset ({capacity} of {args.shards} equal-size shards), "
              f"{args.epochs} epochs, {len(seq)} shard reads")
        print(f"textbook misses for this sequence: OPT {reference_misses(seq, capacity, 'opt')}, "
              f"LRU {reference_misses(seq, capacity, 'lru')}\n")
        print("| eviction | hit rate | misses | bytes fetched (MiB) |")
        print("|---|---:|---:|---:|")
        for name, rate, misses, fetched in hit_rates(manifest, opts, work, seq):
            print(f"| {name} | {rate:.1%} | {misses} | {fetched / 2**20:.0f} |")
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
