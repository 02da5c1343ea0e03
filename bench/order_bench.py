"""Order benchmark: first batch of a 10^10-sample epoch, and ids/s against np.random.permutation.

Run: ``.venv/bin/python bench/order_bench.py [--repeats 5] [--n 10000000]``

1. First batch at scale: a synthetic manifest of 10^10 samples in 40,000 shards (only the row
   counts exist). In a fresh process: build ``EpochOrder`` and take ``ids(0, 1024)``; time it
   with an empty Numba cache (first-call compile) and again with the cache warm, and measure the
   memory it needs (tracemalloc peak of the step, RSS growth during the step, process peak RSS).
2. Throughput: ``EpochOrder.ids(0, n)`` (and ``ids_at`` on random positions, ``rank_ids`` for
   rank 1 of 4) against ``np.random.default_rng(seed).permutation(n)``, medians over repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

SHARDS = 40_000
ROWS_PER_SHARD = 250_000  # 40,000 x 250,000 = 10^10 samples


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _stub_package() -> None:
    """Make ``stoker.loader`` an empty package so its ``__init__`` (DataLoader, torch) is not run.

    Shows what the order itself costs, for a process that only computes orders (audit replay).
    """
    import types

    loader_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "loader")
    pkg = types.ModuleType("stoker.loader")
    pkg.__path__ = [os.path.normpath(loader_dir)]
    sys.modules["stoker.loader"] = pkg


def _first_batch(trace: bool, bare: bool) -> dict[str, Any]:
    """Child process: import, build the order, take the first 1024 ids; report time and memory.

    With ``trace`` the step runs under tracemalloc (slower: only its memory figure is used).
    """
    import tracemalloc

    t0 = time.perf_counter()
    import numpy as np

    if bare:
        _stub_package()
    from stoker.loader.order.epoch import EpochOrder, OrderOptions
    t_import = time.perf_counter() - t0
    rss_before = _rss_mb()
    if trace:
        tracemalloc.start()
    t1 = time.perf_counter()
    rows = np.full(SHARDS, ROWS_PER_SHARD, dtype=np.int64)
    order = EpochOrder(rows, "0" * 32, 1234, 0, OrderOptions())
    t_build = time.perf_counter() - t1
    ids = order.ids(0, 1024)
    t_first = time.perf_counter() - t1
    peak = tracemalloc.get_traced_memory()[1] if trace else 0
    tracemalloc.stop()
    rss_growth = _rss_mb() - rss_before
    t2 = time.perf_counter()
    order.ids(1024, 2048)
    t_next = time.perf_counter() - t2
    t3 = time.perf_counter()
    seq = order.shard_sequence(0, order.num_samples, 1, 4)
    t_seq = time.perf_counter() - t3
    return {"num_samples": order.num_samples, "options": order.options.to_dict(),
            "first_ids": ids[:4].tolist(), "import_s": t_import, "build_s": t_build,
            "build_plus_first_batch_s": t_first, "next_batch_s": t_next,
            "tracemalloc_peak_mb": peak / 2**20, "rss_growth_mb": rss_growth,
            "rss_after_import_mb": rss_before,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "shard_sequence_epoch_rank1of4_s": t_seq, "shard_sequence_len": int(len(seq))}


def _child(cache_dir: str, *flags: str) -> dict[str, Any]:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache_dir}
    out = subprocess.run([sys.executable, __file__, "--child", *flags], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _time(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _throughput(n: int, repeats: int) -> dict[str, tuple[float, float]]:
    """Median seconds and median per-repeat ratio (baseline time / time) of each contender.

    Baseline and contenders run interleaved in every repeat, so a noisy neighbour slows both.
    """
    import numpy as np

    from stoker.loader.order.epoch import EpochOrder, OrderOptions

    rows = np.full(SHARDS, ROWS_PER_SHARD, dtype=np.int64)
    order = EpochOrder(rows, "0" * 32, 1234, 0, OrderOptions())
    positions = np.random.default_rng(0).integers(0, order.num_samples, size=n)
    small = EpochOrder(np.full(max(1, n // 1000), 1000, dtype=np.int64), "0" * 32, 1, 0,
                       OrderOptions())
    contenders: dict[str, Callable[[], object]] = {
        "permutation": lambda: np.random.default_rng(1).permutation(n),
        "ids": lambda: order.ids(0, n),
        "ids_at_random": lambda: order.ids_at(positions),
        "rank_ids_1of4": lambda: order.rank_ids(0, 4 * n, 1, 4),
        "ids_whole_epoch": lambda: small.ids(0, small.num_samples),
    }
    for fn in contenders.values():
        fn()  # warm-up: compile or load kernels, fault pages in
    times: dict[str, list[float]] = {name: [] for name in contenders}
    ratios: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        base = _time(contenders["permutation"])
        for name, fn in contenders.items():
            t = base if name == "permutation" else _time(fn)
            times[name].append(t)
            ratios[name].append(base / t)
    return {name: (statistics.median(times[name]), statistics.median(ratios[name]))
            for name in contenders}


def _machine() -> str:
    import numba
    import numpy as np

    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}, numpy {np.__version__}, "
            f"numba {numba.__version__}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--n", type=int, default=10_000_000, help="ids per throughput run")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_first_batch(args.trace, args.bare)))
        return 0
    print(f"machine: {_machine()}")
    with tempfile.TemporaryDirectory(prefix="stoker-order-bench-") as cache:
        runs = {"cold cache": [_child(cache)]}
        runs["warm cache"] = [_child(cache) for _ in range(args.repeats)]
        runs["warm, no pkg init"] = [_child(cache, "--bare") for _ in range(args.repeats)]
        traced = _child(cache, "--trace")
        traced_bare = _child(cache, "--trace", "--bare")
    cold = runs["cold cache"][0]
    print(f"\n10^10 samples in {SHARDS} shards, options {cold['options']}")
    print(f"  {'(seconds / MiB; warm = median of ' + str(args.repeats) + ')':34s}"
          + "".join(f"{name:>20s}" for name in runs))
    for key in ("import_s", "build_s", "build_plus_first_batch_s", "next_batch_s",
                "rss_growth_mb", "rss_after_import_mb", "peak_rss_mb",
                "shard_sequence_epoch_rank1of4_s"):
        vals = [statistics.median(r[key] for r in rs) for rs in runs.values()]
        print(f"  {key:34s}" + "".join(f"{v:20.4f}" for v in vals))
    print(f"  tracemalloc peak of build + first batch: {traced['tracemalloc_peak_mb']:.2f} MiB "
          f"(no pkg init: {traced_bare['tracemalloc_peak_mb']:.2f} MiB)")
    same = len({json.dumps(r["first_ids"]) for rs in runs.values() for r in rs}) == 1
    print(f"  same first ids in every run: {same}")
    t = _throughput(args.n, args.repeats)
    n = args.n
    print(f"\nthroughput, n = {n:,} ids (median of {args.repeats}, ratio = baseline time / "
          "time, per repeat):")
    for key, label in (("permutation", "np.random.default_rng().permutation(n) [baseline]"),
                       ("ids", "EpochOrder.ids(0, n) on the 10^10 manifest"),
                       ("ids_at_random", "EpochOrder.ids_at(n random positions)"),
                       ("rank_ids_1of4", "EpochOrder.rank_ids(0, 4n, rank 1 of 4)"),
                       ("ids_whole_epoch", "EpochOrder.ids: whole epoch of N = n")):
        secs, ratio = t[key]
        print(f"  {label:52s} {secs:8.4f} s  {n / secs / 1e6:7.1f} M ids/s  ratio {ratio:5.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
