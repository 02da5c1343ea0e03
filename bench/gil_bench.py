"""Why thread workers lose on W1 without shuffle: how much of a batch holds the GIL.

``.venv/bin/python bench/gil_bench.py [--rows N]`` reads W1 (bench/loader_bench.py's data,
built if missing) through one ``ArrowSource`` (records built and mapped first), all batches
of an epoch, once in one thread and once split over two threads, for natural order and for
random ids (what shuffle gives). If two threads are not faster, the batch is bound by Python
holding the GIL, not by the nogil kernels; the cProfile lines show where that Python time is.
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


def main(argv: list[str] | None = None) -> int:
    import loader_bench as lb
    from stoker.loader.read.arrow import ArrowSource
    from stoker.manifest import Manifest

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/stoker-loader-bench"))
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

    for shuffle in (False, True):
        work(0, steps, shuffle)
        src.wait_row_major()
        work(0, steps, shuffle)
        t = time.perf_counter()
        work(0, steps, shuffle)
        one = time.perf_counter() - t
        threads = [threading.Thread(target=work, args=(0, steps // 2, shuffle)),
                   threading.Thread(target=work, args=(steps // 2, steps, shuffle))]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        two = time.perf_counter() - t
        print(f"{'random ids' if shuffle else 'natural order'}: {one / steps * 1e3:.3f} ms per "
              f"batch in 1 thread; 2 threads {one / two:.2f}x the 1-thread rate")
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
