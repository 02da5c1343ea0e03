"""Cost of the ledger's content digests on W1 (issue 14: at most 3 % of W1 throughput).

    .venv/bin/python bench/content_digest_bench.py [--rows 400000] [--repeats 5] [--workers 0]

Same process, same dataset, one warm loader per variant, epochs back to back in alternating
order: W1 (see bench/loader_bench.py: batch 1024, features [B,64] f32, categoricals [B,8] i64,
seq [B,16] f32, label) read (a) with a ledger without content digests (the baseline: ids and
timings only; a second such loader is the control: how far two identical loaders differ
here), (b) with digests computed from the batch's tensors (the way before the fast path
digested its own arrays) and (c) from the fast path's arrays (the default).

Reported: median samples/s and CPU seconds per epoch of each, the median (and quartiles) of
the per-repeat slowdowns against (a), the share of the epoch's wall time spent inside the
digests (timed around each call: robust to the run-to-run noise of a shared machine) and
their median per batch; the digest's own cost on one hot W1 batch three ways (from the
tensors as the audit does, from the arrays behind them as the fast path does, and the bare
xxh3 pass: the floor); whether handing the xxh3 pass to a helper thread, to overlap it
with GIL-free work on the other core, pays for the hand-off; and xxh3's GB/s by buffer size.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import sys
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import loader_bench as lb  # noqa: E402 - W1's data

FEATURES, CATS, BATCH = lb.FEATURES, lb.CATS, lb.W1_BATCH


# a second loader without digests is the control: how far two identical loaders differ here
VARIANTS = ("no digests", "no digests (control)", "digests from tensors", "digests from arrays")


def loaders(path: Path, tmp: Path, workers: int) -> dict[str, Any]:
    """One warm loader per variant (records built, pages warm): a ledger without content
    digests (the baseline: ids and timings only; twice, the second as a control); with them
    computed from the batch's tensors after the source returned it (the audit's way, and the
    loader's before the fast path digested its own arrays); with them from the fast path's
    arrays (the default now)."""
    from stoker.loader import DataLoader, LedgerOptions, ReadOptions

    out = {}
    for i, name in enumerate(VARIANTS):
        dl = DataLoader(path, batch_size=BATCH, shuffle=True, seed=0, num_workers=workers,
                        columns=["seq", "label"],
                        read=ReadOptions(features=FEATURES, categoricals=CATS),
                        ledger=LedgerOptions(tmp / f"{i}.ledger", content="from" in name))
        if name == "digests from tensors":  # this loader's task only (bench-only patch)
            dl._task.fetch = types.MethodType(_from_tensors, dl._task)
        out[name] = dl
        epoch(dl)
    return out


def _from_tensors(self, ids, epoch, seed):  # type: ignore[no-untyped-def]
    """``BatchTask.fetch`` as it was before the fast path digested its own arrays."""
    import stoker.loader.epoch_iter as epoch_iter

    batch = self.source.fetch(ids, epoch, seed)
    return batch, epoch_iter.batch_digests(batch, self.content)


def epoch(dl: Any) -> tuple[float, float, float, list[float]]:
    """(samples/s, seconds, CPU seconds of this process, seconds spent in each
    ``batch_digests`` call) of one epoch. The digests are timed inside the loader, around
    every call, so their share does not depend on run-to-run noise; nor does the process's
    CPU time much (other processes' bursts take cores away, not CPU time)."""
    import stoker.loader.epoch_iter as epoch_iter

    spent: list[float] = []
    real = epoch_iter.batch_digests  # also what the fast path calls back (fetch_digested)

    def timed(*args):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        out = real(*args)
        spent.append(time.perf_counter() - t)
        return out

    epoch_iter.batch_digests = timed
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        n = sum(len(b["label"]) for b in dl)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        epoch_iter.batch_digests = real
    return n / dt, dt, cpu, spent


def _hot_batch(path: Path) -> dict:
    from stoker.loader import DataLoader, ReadOptions

    dl = DataLoader(path, batch_size=BATCH, shuffle=True, seed=0, columns=["seq", "label"],
                    read=ReadOptions(features=FEATURES, categoricals=CATS))
    batch = {k: v.clone() for k, v in next(iter(dl)).items()}
    dl.close()
    return batch


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
            runs[name].append(lb.median_seconds(fn, 2000) * 1e6)
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
            runs[name].append(lb.median_seconds(fn, 400) * 1e6)
    jobs.put(None)
    thread.join()
    return {name: statistics.median(v) for name, v in runs.items()}


def _paired(base: list[float], other: list[float], rates: bool) -> str:
    """Median (and quartiles) of the per-repeat slowdowns of ``other`` against ``base``
    (samples/s when ``rates``, else seconds)."""
    runs = sorted(100 * (1 - o / b) if rates else 100 * (o / b - 1) for b, o in zip(base, other))
    return (f"{statistics.median(runs):+.1f} % ({runs[len(runs) // 4]:+.1f} .. "
            f"{runs[(3 * len(runs)) // 4]:+.1f})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/stoker-content-bench"))
    args = ap.parse_args(argv)
    path = lb.build_w1(args.workdir, args.rows) / "stoker"
    rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
    cpus: dict[str, list[float]] = {name: [] for name in VARIANTS}
    shares: dict[str, list[float]] = {name: [] for name in VARIANTS}
    per_batch: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        dls = loaders(path, Path(tmp), args.workers)
        for r in range(args.repeats):  # back to back, order alternating
            for name in (VARIANTS if r % 2 == 0 else VARIANTS[::-1]):
                rate, seconds, cpu, spent = epoch(dls[name])
                rates[name].append(rate)
                cpus[name].append(cpu)
                shares[name].append(sum(spent) / seconds)
                per_batch[name] += spent
        for dl in dls.values():
            dl.close()
    batch = _hot_batch(path)
    speed = digest_speed(batch)
    handoff = helper_thread(batch)
    nbytes = sum(v.numel() * v.element_size() for v in batch.values())
    print(f"W1 {args.rows} rows, batch {BATCH}, workers {args.workers}, {args.repeats} repeats")
    for name in VARIANTS:
        # each repeat runs every variant back to back: the median of the per-repeat
        # slowdowns cancels the slow drifts of a shared machine that a ratio of medians keeps
        line = (f"{name:21s} median {statistics.median(rates[name]):>10,.0f} samples/s, "
                f"{statistics.median(cpus[name]):.3f} CPU s per epoch")
        if name != VARIANTS[0]:
            line += (f"; slowdown {_paired(rates[VARIANTS[0]], rates[name], True)} wall, "
                     f"{_paired(cpus[VARIANTS[0]], cpus[name], False)} CPU")
        if per_batch[name]:
            line += (f"; in the digests {100 * statistics.median(shares[name]):.1f} % of the "
                     f"epoch, median {statistics.median(per_batch[name]) * 1e6:.1f} us per batch")
        print(line)
    print(f"one hot W1 batch ({nbytes / 1e3:.0f} KB), median us: "
          + ", ".join(f"{k} {v:.1f}" for k, v in speed.items())
          + f" ({nbytes / speed['xxh3 alone'] / 1e3:.0f} GB/s)")
    print("hand-off to a helper thread, median us: "
          + ", ".join(f"{k} {v:.1f}" for k, v in handoff.items()))
    print("xxh3 GB/s by buffer size (hot): "
          + ", ".join(f"{kb} KB {rate:.0f}" for kb, rate in xxh3_by_size().items()))
    return 0


def xxh3_by_size() -> dict[int, float]:
    """GB/s of python-xxhash's xxh3-64 over a hot buffer of 4 KB .. 1 MB (median of 5): is the
    pass bound by the cache level the bytes sit in, or by its own compute?"""
    import numpy as np
    import xxhash

    out = {}
    for kb in (4, 16, 256, 1024):
        buf = np.random.default_rng(0).random(kb * 128)
        seconds = lb.median_seconds(lambda: xxhash.xxh3_64_intdigest(buf, 5), 200_000 // kb)
        out[kb] = buf.nbytes / seconds / 1e9
    return out


if __name__ == "__main__":
    raise SystemExit(main())
