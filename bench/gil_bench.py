"""Why thread workers lost on W1: how much of a batch holds the GIL, and what a hand-over costs.

``.venv/bin/python bench/gil_bench.py [--rows N]`` reads W1 (bench/loader_bench.py's data,
built if missing) through one ``ArrowSource`` (records built and mapped first), all batches
of an epoch, once in one thread and once split over two threads, for natural order and for
random ids (what shuffle gives): one batch per call (``fetch``), and groups of
``--group`` batches per call (``fetch_group``, what a thread worker does). It also times a
hand-over between two threads (a lock passed back and forth), the price of every GIL
hand-over. If two threads are not faster, the batch is bound by Python holding the GIL or by
hand-overs, not by the nogil kernels; the cProfile lines show where that Python time is.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def handover(rounds: int = 20_000) -> float:
    """Seconds per round trip of a lock passed between two threads: each pass wakes the
    other thread, as each GIL hand-over between busy workers does."""
    ping, pong = threading.Lock(), threading.Lock()
    ping.acquire()
    pong.acquire()

    def other() -> None:
        for _ in range(rounds):
            ping.acquire()
            pong.release()

    th = threading.Thread(target=other)
    th.start()
    t = time.perf_counter()
    for _ in range(rounds):
        ping.release()
        pong.acquire()
    took = time.perf_counter() - t
    th.join()
    return took / rounds


def loader_epochs(path: Path, epochs: int) -> None:
    """Through the DataLoader, in this process: W1 rows/s of later epochs (after one untimed
    epoch builds the records), median over ``epochs``, for 0 and 2 thread workers, shuffle
    on and off, and shuffled from staged rounds (``row_major="staged"``: the path past the
    records budget), with thread workers' groups (up to 8 batches per task, the default) and
    with one batch per task (stoker.loader.dataloader._GROUP_MAX set to 1: what workers did
    before 1f5d472, and from staged rounds before groups were read from them)."""
    import statistics

    import loader_bench as lb
    from stoker.loader import DataLoader, ReadOptions
    from stoker.loader import dataloader as dl_module

    grouped = dl_module._GROUP_MAX
    for shuffle, row_major in ((False, "auto"), (True, "auto"), (True, "staged")):
        for workers, group in ((0, grouped), (2, 1), (2, grouped)):
            dl_module._GROUP_MAX = group
            loader = DataLoader(path, batch_size=lb.W1_BATCH, shuffle=shuffle, seed=0,
                                num_workers=workers, columns=["seq", "label"],
                                read=ReadOptions(features=lb.FEATURES, categoricals=lb.CATS,
                                                 row_major=row_major))
            rates = []
            for epoch in range(epochs + 1):
                loader.set_epoch(epoch)
                t, n = time.perf_counter(), 0
                for batch in loader:
                    n += len(batch["label"])
                if epoch:
                    rates.append(n / (time.perf_counter() - t))
            loader.close()
            what = "no workers" if not workers else \
                f"{workers} thread workers, {group} batch{'es' if group > 1 else ''} per task"
            order = "natural order" if not shuffle else \
                "shuffled, staged rounds" if row_major == "staged" else "shuffled"
            print(f"DataLoader, {order}, {what}: "
                  f"{statistics.median(rates) / 1e6:.2f} M rows/s (later epochs, in-process)")
    dl_module._GROUP_MAX = grouped


def main(argv: list[str] | None = None) -> int:
    import loader_bench as lb
    from stoker.loader.read.arrow import ArrowSource
    from stoker.manifest import Manifest

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/stoker-loader-bench"))
    ap.add_argument("--group", type=int, default=8, help="batches per fetch_group call")
    ap.add_argument("--epochs", type=int, default=5, help="later epochs timed per loader")
    args = ap.parse_args(argv)
    lb.prepare(args.workdir, args.rows, 0)
    m = Manifest.load(args.workdir / f"w1-{args.rows}" / "stoker")
    src = ArrowSource(m, features=lb.FEATURES, categoricals=lb.CATS, columns=["seq", "label"])
    steps = args.rows // lb.W1_BATCH

    def work(lo: int, hi: int, shuffle: bool) -> None:
        rng = np.random.default_rng(lo)
        for s in range(lo, hi):
            ids = rng.integers(0, args.rows, lb.W1_BATCH) if shuffle \
                else np.arange(s * lb.W1_BATCH, (s + 1) * lb.W1_BATCH)
            src.fetch(ids)

    def grouped(lo: int, hi: int, shuffle: bool) -> None:
        rng = np.random.default_rng(lo)
        for s in range(lo, hi, args.group):
            batches = [rng.integers(0, args.rows, lb.W1_BATCH) if shuffle
                       else np.arange(b * lb.W1_BATCH, (b + 1) * lb.W1_BATCH)
                       for b in range(s, min(hi, s + args.group))]
            if len(batches) == 1:  # the epoch's last, alone: fetch_group takes two or more
                src.fetch(batches[0])
            elif src.fetch_group(batches, 0, 0, None) is None:
                raise SystemExit("fetch_group declined: records are not built for every shard")

    print(f"hand-over between two threads (lock ping-pong): {handover() * 1e6:.1f} us per "
          "round trip")
    for shuffle in (False, True):
        work(0, steps, shuffle)
        src.wait_row_major()
        for name, fn in (("1 batch per call", work), (f"{args.group} per call", grouped)):
            fn(0, steps, shuffle)
            t = time.perf_counter()
            fn(0, steps, shuffle)
            one = time.perf_counter() - t
            half = steps // 2 // args.group * args.group
            threads = [threading.Thread(target=fn, args=(0, half, shuffle)),
                       threading.Thread(target=fn, args=(half, steps, shuffle))]
            t = time.perf_counter()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            two = time.perf_counter() - t
            print(f"{'random ids' if shuffle else 'natural order'}, {name}: "
                  f"{one / steps * 1e3:.3f} ms per batch in 1 thread; 2 threads "
                  f"{one / two:.2f}x the 1-thread rate")
    loader_epochs(args.workdir / f"w1-{args.rows}" / "stoker", args.epochs)
    prof = cProfile.Profile()
    prof.enable()
    work(0, 500, False)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(8)
    print(out.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
