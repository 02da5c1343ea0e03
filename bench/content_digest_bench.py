"""Cost of the ledger's content digests on W1 (issue 14: at most 3 % of W1 throughput).

    .venv/bin/python bench/content_digest_bench.py [--rows 400000] [--repeats 5] [--workers 0]

Same process, same dataset, alternating runs: W1 (see bench/loader_bench.py: batch 1024,
features [B,64] f32, categoricals [B,8] i64, seq [B,16] f32, label) read for one warm epoch
(a) with a ledger without content digests (the baseline: ids and timings only) and (b) with
a ledger with content digests (the default). Reported: median samples/s of each and the
slowdown, the share of the epoch's wall time spent inside the digests (timed around each
call: robust to the run-to-run noise of a shared machine) and their median per batch; the
digest's own cost on one hot W1 batch three ways (from the tensors as the audit does, from
the arrays behind them as the fast path does, and the bare xxh3 pass: the floor); and
whether handing the xxh3 pass to a helper thread, to overlap it with GIL-free work on the
other core, pays for the hand-off.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import loader_bench as lb  # noqa: E402 - W1's data

FEATURES, CATS, BATCH = lb.FEATURES, lb.CATS, lb.W1_BATCH


def epoch(path: Path, ledger: Path, content: bool, workers: int) -> tuple[float, float, float]:
    """(samples/s, share of the epoch's wall time spent in the digests, median us per batch
    in them) of one epoch after a warm-up epoch (records built, pages warm). The share is
    timed inside the loader, around every ``batch_digests`` call, so it does not depend on
    run-to-run noise."""
    import stoker.loader.epoch_iter as epoch_iter
    from stoker.loader import DataLoader, LedgerOptions, ReadOptions

    spent: list[float] = []
    real = epoch_iter.batch_digests  # also what the fast path calls back (fetch_digested)

    def timed(*args):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        out = real(*args)
        spent.append(time.perf_counter() - t)
        return out

    epoch_iter.batch_digests = timed
    try:
        dl = DataLoader(path, batch_size=BATCH, shuffle=True, seed=0, num_workers=workers,
                        columns=["seq", "label"],
                        read=ReadOptions(features=FEATURES, categoricals=CATS),
                        ledger=LedgerOptions(ledger, content=content))
        for _ in dl:
            pass
        spent.clear()
        t0 = time.perf_counter()
        n = sum(len(b["label"]) for b in dl)
        dt = time.perf_counter() - t0
        dl.close()
    finally:
        epoch_iter.batch_digests = real
    return n / dt, sum(spent) / dt, statistics.median(spent) * 1e6 if spent else 0.0


def _hot_batch(path: Path) -> dict:
    from stoker.loader import DataLoader, ReadOptions

    dl = DataLoader(path, batch_size=BATCH, shuffle=True, seed=0, columns=["seq", "label"],
                    read=ReadOptions(features=FEATURES, categoricals=CATS))
    batch = {k: v.clone() for k, v in next(iter(dl)).items()}
    dl.close()
    return batch


def _median_us(fn, repeats: int = 2000) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def digest_speed(batch: dict) -> dict[str, float]:
    """Median us per W1 batch (hot in cache, as the fast path digests it right after its
    kernels wrote it): from the tensors (the audit's way), from the arrays behind them (the
    fast path's way), and the bare xxh3 pass over the same bytes (the floor)."""
    import xxhash

    from stoker.loader.ledger.digest import batch_digests

    cols = ["features", "categoricals", "seq", "label"]
    arrays = {k: v.numpy() for k, v in batch.items()}
    ways = {"tensors": lambda: batch_digests(batch, cols),
            "arrays": lambda: batch_digests(batch, cols, arrays),
            "xxh3 alone": lambda: [xxhash.xxh3_64_intdigest(arrays[c], seed=1) for c in cols]}
    runs: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(5):  # alternating, medians of medians
        for name, fn in ways.items():
            runs[name].append(_median_us(fn))
    return {name: statistics.median(v) for name, v in runs.items()}


def helper_thread(batch: dict) -> dict[str, float]:
    """Median us of ~60 us of GIL-free work (xxh3 over an L2-resident 256 KB array, as a
    nogil kernel would run) alone, with the batch's xxh3 pass inline, and with that pass
    handed to a helper thread (queue.SimpleQueue) that overlaps it: does overlapping on the
    other core pay for the hand-off?"""
    import queue
    import threading

    import numpy as np
    import xxhash

    cols = ["features", "categoricals", "seq", "label"]
    arrays = [batch[c].numpy() for c in cols]
    other = np.random.default_rng(0).random(32 * 1024)

    def work() -> None:
        for _ in range(12):
            xxhash.xxh3_64_intdigest(other)

    def digest() -> list[int]:
        return [xxhash.xxh3_64_intdigest(a, seed=1) for a in arrays]

    jobs: queue.SimpleQueue = queue.SimpleQueue()
    done: queue.SimpleQueue = queue.SimpleQueue()

    def helper() -> None:
        while (job := jobs.get()) is not None:
            done.put(job())

    thread = threading.Thread(target=helper, daemon=True)
    thread.start()

    def overlapped() -> None:
        jobs.put(digest)
        work()
        done.get()

    ways = {"work alone": work, "+ xxh3 inline": lambda: (digest(), work()),
            "+ xxh3 on a helper thread": overlapped}
    runs: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(5):
        for name, fn in ways.items():
            runs[name].append(_median_us(fn, 400))
    jobs.put(None)
    thread.join()
    return {name: statistics.median(v) for name, v in runs.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/stoker-content-bench"))
    args = ap.parse_args(argv)
    path = lb.build_w1(args.workdir, args.rows) / "stoker"
    with tempfile.TemporaryDirectory() as tmp:
        runs: dict[bool, list[float]] = {False: [], True: []}
        shares: list[float] = []
        per_batch: list[float] = []
        for r in range(args.repeats):
            for content in ((False, True) if r % 2 == 0 else (True, False)):
                rate, share, us = epoch(path, Path(tmp) / f"{r}-{content}.ledger", content,
                                        args.workers)
                runs[content].append(rate)
                if content:
                    shares.append(share)
                    per_batch.append(us)
    base, with_digest = statistics.median(runs[False]), statistics.median(runs[True])
    batch = _hot_batch(path)
    speed = digest_speed(batch)
    handoff = helper_thread(batch)
    nbytes = sum(v.numel() * v.element_size() for v in batch.values())
    print(f"W1 {args.rows} rows, batch {BATCH}, workers {args.workers}, {args.repeats} repeats")
    print(f"ledger without content digests  median {base:,.0f} samples/s")
    print(f"ledger with content digests     median {with_digest:,.0f} samples/s "
          f"({100 * (1 - with_digest / base):+.1f} %)")
    print(f"time inside the digests: median {100 * statistics.median(shares):.1f} % of the "
          f"epoch (runs: {', '.join(f'{100 * s:.1f}' for s in shares)}), "
          f"median {statistics.median(per_batch):.1f} us per batch")
    print(f"one hot W1 batch ({nbytes / 1e3:.0f} KB), median us: "
          + ", ".join(f"{k} {v:.1f}" for k, v in speed.items())
          + f" ({nbytes / speed['xxh3 alone'] / 1e3:.0f} GB/s)")
    print("hand-off to a helper thread, median us: "
          + ", ".join(f"{k} {v:.1f}" for k, v in handoff.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
