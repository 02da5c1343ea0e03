"""Cost of the ledger's content digests on W1 (issue 14: at most 3 % of W1 throughput).

    .venv/bin/python bench/content_digest_bench.py [--rows 400000] [--repeats 5] [--workers 0]

Same process, same dataset, alternating runs: W1 (see bench/loader_bench.py: batch 1024,
features [B,64] f32, categoricals [B,8] i64, seq [B,16] f32, label) read for one warm epoch
(a) with a ledger without content digests (the baseline: ids and timings only) and (b) with
a ledger with content digests (the default). Reported: median samples/s of each and the
slowdown, the share of the epoch's wall time spent inside the digests (timed around each
call: robust to the run-to-run noise of a shared machine), and the digest's own cost per
batch on hot W1 batches (GB/s).
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


def epoch(path: Path, ledger: Path, content: bool, workers: int) -> tuple[float, float]:
    """(samples/s, share of the epoch's wall time spent in the digests) of one epoch after a
    warm-up epoch (records built, pages warm). The share is timed inside the loader, around
    every ``batch_digests`` call, so it does not depend on run-to-run noise."""
    import stoker.loader.epoch_iter as epoch_iter
    from stoker.loader import DataLoader, LedgerOptions, ReadOptions

    spent = [0.0]
    real = epoch_iter.batch_digests  # also what the fast path calls back (fetch_digested)

    def timed(*args):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        out = real(*args)
        spent[0] += time.perf_counter() - t
        return out

    epoch_iter.batch_digests = timed
    try:
        dl = DataLoader(path, batch_size=BATCH, shuffle=True, seed=0, num_workers=workers,
                        columns=["seq", "label"],
                        read=ReadOptions(features=FEATURES, categoricals=CATS),
                        ledger=LedgerOptions(ledger, content=content))
        for _ in dl:
            pass
        spent[0] = 0.0
        t0 = time.perf_counter()
        n = sum(len(b["label"]) for b in dl)
        dt = time.perf_counter() - t0
        dl.close()
    finally:
        epoch_iter.batch_digests = real
    return n / dt, spent[0] / dt


def digest_speed(path: Path) -> tuple[float, float, float]:
    """(ms per batch, GB/s) of batch_digests alone on W1 batches (tensors, as the audit
    digests them), and ms per batch given the arrays behind them (as the fast path does)."""
    from stoker.loader import DataLoader, LedgerOptions, ReadOptions
    from stoker.loader.ledger.digest import batch_digests

    dl = DataLoader(path, batch_size=BATCH, shuffle=True, seed=0, columns=["seq", "label"],
                    read=ReadOptions(features=FEATURES, categoricals=CATS))
    batches = []
    for b in dl:
        batches.append({k: v.clone() for k, v in b.items()})
        if len(batches) == 50:
            break
    dl.close()
    cols = ["features", "categoricals", "seq", "label"]
    nbytes = sum(v.numel() * v.element_size() for v in batches[0].values())
    arrays = [{k: v.numpy() for k, v in b.items()} for b in batches]
    t0 = time.perf_counter()
    for _ in range(5):
        for b in batches:
            batch_digests(b, cols)
    per = (time.perf_counter() - t0) / (5 * len(batches))
    t0 = time.perf_counter()
    for _ in range(5):
        for b, a in zip(batches, arrays):
            batch_digests(b, cols, a)
    per_arrays = (time.perf_counter() - t0) / (5 * len(batches))
    return per * 1e3, nbytes / per / 1e9, per_arrays * 1e3


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
        for r in range(args.repeats):
            for content in ((False, True) if r % 2 == 0 else (True, False)):
                rate, share = epoch(path, Path(tmp) / f"{r}-{content}.ledger", content,
                                    args.workers)
                runs[content].append(rate)
                if content:
                    shares.append(share)
    base, with_digest = statistics.median(runs[False]), statistics.median(runs[True])
    ms, gbs, ms_arrays = digest_speed(path)
    print(f"W1 {args.rows} rows, batch {BATCH}, workers {args.workers}, {args.repeats} repeats")
    print(f"ledger without content digests  median {base:,.0f} samples/s")
    print(f"ledger with content digests     median {with_digest:,.0f} samples/s "
          f"({100 * (1 - with_digest / base):+.1f} %)")
    print(f"time inside the digests: median {100 * statistics.median(shares):.1f} % of the "
          f"epoch (runs: {', '.join(f'{100 * s:.1f}' for s in shares)})")
    print(f"digest alone on 50 W1 batches: {ms:.3f} ms per batch ({gbs:.1f} GB/s) from the "
          f"tensors, {ms_arrays:.3f} ms from their arrays (the fast path's way)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
