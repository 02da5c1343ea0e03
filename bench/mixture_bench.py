"""Mixture benchmark: a 3-source mixture vs the single-source loader on the same bytes.

One command (``.venv/bin/python bench/mixture_bench.py``) builds the data once under
``--workdir`` and, in this one process, keeps the mixture and the single-source loader of a
case alive together: each reads one untimed warm-up epoch (it builds the row-major records and
warms the page cache), then they take turns epoch by epoch for ``--epochs`` timed epochs each,
and each one's median is its rate (beyond the records budget, 3 fresh loaders of each, one
after the other, ``--beyond-epochs`` each). Then it measures the blend alone.

* **W1**: three W1-shaped tabular sources (64 float32, 8 int64, list<float32>[16], int64
  label; ``--rows`` rows split 1:2:3), batch 1024, shuffle on, outputs features [B,64],
  categoricals [B,8], seq [B,16], label.
* **images**: three image sources (64x64 RGB JPEGs + label; ``--images`` split 1:2:3), batch
  256, decoded to uint8 [B,64,64,3].

The baseline is one stoker dataset whose manifest lists the three sources' shard files
(hard links: the very same bytes). The mixture's weights are proportional to size, so one
mixture epoch reads exactly the rows one single-source epoch reads, each once; what differs
is the blend, the per-source split of every batch and the merge back into stream order.
Goal: the mixture at >= 90 % of the single-source rows/s.

Where the W1 difference comes from (``split``): with one loader of each alive, per epoch and
median over ``--repeats``, the CPU time of computing every batch's ids (the order: the blend
and the sources' pass orders against one dataset's order), and the single-source reader
reading the mixture's ids against its own (the same rows; only the order they are read in
differs, so this is the stream's locality, not the mixture's code).

Beyond the records budget (``--beyond-rows``, default 6,000,000 W1 rows: 2.35 GB of records
against a budget of at most 2 GiB): the same pair with default options, both staging their
rounds (the mixture each source's, stoker.loader.read.mixture_staging), beside the mixture read
from the shards' columns, what a mixture beyond the budget read before.

Blend state: ``tracemalloc`` peak while a 1,000-source blend is built and read at positions
near 10**10 (goal < 10 MB), and the blend's own positions/s for 3, 7 and 1,000 sources.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any, Callable

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from loader_bench import CATS, FEATURES, _make_images  # noqa: E402
from results_md import write_section  # noqa: E402

NAMES = ("a", "b", "c")
SPLIT = (1, 2, 3)
NOTES = """\
- The three sources share one schema and are local, so the mixture reads every batch with one
  reader over the union of their shards (stoker.loader.read.mixture_union): the read code is
  a single dataset's. Its reads of the mixture's ids (the "reads" rows: the same rows in
  another order, so the stream's locality) cost about what its own did at 9e1e2f8, and
  12-40 % more in session 16's four runs (the mixture's batches span three sources' shards).
  What the mixture adds is its order: the blend (positions/s
  below) and each source's own pass order over its picks (one range kernel call per source
  and pass, then two O(window) kernels place the ids; the `source` column is one kernel pass
  over a batch's ids), computed 64 k positions at a time on a background thread
  (`stoker-order`, two chunks ahead of the batch being read; 16 k chunks gave 72-75 % at 2
  workers against 79-81 % with 64 k, same runs: each chunk calls a kernel per source and
  pass, and each call hands the GIL over and back). The "order CPU" rows count
  the process's CPU, both threads. Since session 19 each source takes a share of the
  partitions in proportion to its size (stoker.mixture-order/2,
  `stoker.loader.order.mixture_order.source_options`): here 60, 120 and 180 of 360, so its
  partitions are as long as one dataset's. With all P for every source (before) the small
  sources' partitions were shorter than a block, where a Feistel walk takes more steps: the
  mixture's order cost 16.1 ms CPU an epoch against 12.6-12.9 ms now, and 7.4 ms for one
  dataset's ids (ad hoc, 64 k chunks computed inline, median of 15 epochs; the rest is the
  blend, ~2.7 ms, and placing the ids, ~2 ms).
- With 0 workers that order runs on the second core, beside the consumer, whose Python it
  holds up at each of its own Python steps (one per source and pass of a chunk); with 2
  thread workers every core is busy. Either way the mixture's extra order CPU (~8-10 ms per
  epoch more than the single source's ids, which the consumer cuts from 16 k chunks since
  1f5d472) is the gap. Until session 16 this command timed one epoch per loader, and read
  96-112 % with 0 workers; the median of 5 epochs per loader reads lower. Thread
  workers read 8 batches per task since 1f5d472 (one record gather, bench/RESULTS.md
  "Workers and the GIL"), the mixture as the single source: both read about twice as fast
  with 2 workers as in this table at 9e1e2f8 (mixture 3,872,984 rows/s, single 4,276,190),
  the single source more, so the ratio fell from 87-91 % to ~80 % (three runs with 64 k
  chunks: 80, 80, 79).
- Session 21 (b7f88b3), W1 with 2 thread workers, ad hoc (/tmp/s21/mixt.py: both loaders
  taking turns, 30-40 epochs, first batch and the rest timed apart): the mixture's rest of
  an epoch took 50-58 ms against the single source's 43-51, and its first batch 5-7 ms
  against 3. The rest: a group's `"source"` columns came from `torch.split`, a torch call
  that releases and retakes the GIL, each time behind the other threads' Python; with the
  `source` column left out the mixture read 89-93 %, with NumPy views of one array
  (`torch.from_numpy` of each batch's slice, no GIL hand-over) 87-89 %, with `split` 82 %.
  The first batch: the first chunk of an epoch's order was computed inline by the consumer
  (~3 ms for 64 k positions); the chunk is now asked of the order thread when the previous
  epoch's chunks reach its end (the loader reads epoch e + 1 after e unless `set_epoch`
  says otherwise; another epoch drops it), and the mixture's first batch takes what the
  single source's does (2.7-3.3 ms). The table above is the first run of this command
  after both.
- A group's `"source"` column is one kernel call that now keeps the GIL
  (`stoker.loader.jit.kernel.gil_kernel`): released, the worker thread waited to get it
  back from the other threads' Python after a few microseconds of work (py-spy: ~25 ms of
  an epoch's ~80 ms at that line). Two runs of this command with it, one epoch per loader:
  82 %, then 85 %.
- Until 81e3b5b the consumer computed each chunk itself when a batch crossed into it
  (~1.3 ms): with prefetch_factor 2, two workers' queue held ~0.6 ms of work, so every chunk
  drained it (W1 mixture at 2 workers: 83 % of the single source; 101 % with
  prefetch_factor=8, which is how the cause was found).
- Sources that cannot share a reader (other schemas, remote) are read one by one and merged;
  each reader call has a fixed cost (~0.1 ms here), so that path runs at about half the
  single-source rate on W1.
- Beyond the records budget (session 18): each source of a mixture stages its own rounds
  (stoker.loader.read.mixture_staging), where the mixture read every row without records from
  its shards' columns before (the last column). Its default partitions fit the sources'
  summed staging (`mixture_plan`); since each source stages rounds of its share of the
  partitions (session 19), that sum is about one dataset's: here 720 partitions, as for the
  single source (240 in session 18's table, when every source staged rounds of all 720 / 3
  partitions, 27 rounds an epoch against 9). A batch reads the round each
  source's last batch ended in first; only on a miss (a source entering its next block) are
  its rounds looked up from the ids (~0.1 ms a source: ~0.3 ms a batch when done for every
  batch, which read 1.6-1.7 M rows/s at 600 k rows forced to stage, against 5.5-5.8 M now,
  ad hoc). A source that fits one round per pass is then staged once and read across its
  passes (a round serves any id it holds, whichever pass staged it).
- The blend's state is O(sources): the restart at a far position costs O(1 / smallest weight)
  EDF steps (about the number of sources for balanced weights), then O(log sources) per
  position. Random access for 1,000 sources includes the exact big-integer restart (Python).
- A blend without a schedule (one segment) of up to 128 sources runs its own kernel
  (stoker.loader.order.blend_kernel.run_blend_flat, session 17): a linear scan without the
  segment steps; the same stream (a Hypothesis test against the segmented kernel). This
  table's positions/s against the tree before, same session: 3 sources 65.7 -> 89.0 M,
  7 sources 31.7 -> 42.3 M, 30 sources 9.2 -> 19.4 M (those ran heaps), 100 sources 7.4 ->
  10.8 M; 1,000 sources keep the heaps (3.7-4.2 M). One blend call per 1,024 positions here;
  in 600 k-position kernel calls, 3 sources 10-11 -> 4.1 ns per position, 17 sources
  52-62 -> 22 ns.
- Where the 2-worker gap goes (session 17, ad hoc, 600 k rows, epochs 1-30 of one loader,
  per-thread CPU from /proc): the single source computes its order inline in the consumer,
  13 ms per epoch in 16 k chunks; the mixture's order thread spends 28-31 ms per epoch
  (blend 8-10 ms, the sources' pass orders 12-15 ms, placing 2 ms) and the consumer waits
  0.4-1 ms per epoch for its chunks (3.5 ms for the first one, inline). With 2 thread workers
  both cores are busy, so that extra CPU costs about half its time in wall clock, and the
  reads of the mixture's ids cost 8-15 % more (above): ~84-93 against ~66-76 ms per epoch.
- Session 19, same question after the partition shares (ad hoc, 4 runs of 50-60 epochs per
  loader, alternating, process CPU per epoch): with 2 thread workers the mixture spends
  101-126 ms CPU an epoch against 83-98 for the single source (+18-20 %), with 0 workers 112
  against 89; its order accounts for ~5.5 ms of that and the `source` column ~1 ms. The
  single reader reading the mixture's ids costs what its own do (67.3-67.5 against 69.9 ms,
  one thread): the locality is the same. The rest shows as time the consumer and the workers
  spend waiting to take the GIL back (py-spy: the consumer's lines ~2x longer with the
  mixture, the same code) and, with 0 workers, as the record gather running ~30 % slower
  while the order thread works on the other core. Tried and measured without a clear gain
  (80-87 % against 79-87 % for the same code in the same runs): the chunks computed as jobs
  on the worker threads (no extra thread), the order thread at nice 5, the short kernels
  (`pick_spans`, `place`) keeping the GIL; chunks of 16 k computed by the consumer read
  73-77 %.
- Since session 19 the two loaders of a case take turns epoch by epoch, 40 epochs each (the
  medians above): timed one after the other (3 x 5 epochs each, as before), one run of this
  command read the W1 mixture at 125 % of the single source with 0 workers and 76 % with 2,
  the single source's own rate swinging between 5.5 and 12.5 M rows/s."""


# -- data ------------------------------------------------------------------------------------
def _w1_source(root: Path, rows: int, seed: int) -> None:
    from stoker.sharder import shard
    from stoker.sharder.synthetic import write_tabular_parquet

    if (root / "manifest.json").exists():
        return
    root.parent.mkdir(parents=True, exist_ok=True)
    parquet = root.parent / f"{root.name}.parquet"
    write_tabular_parquet(parquet, rows, seed=seed)
    shard(str(parquet), str(root), progress=False, overwrite=True)
    parquet.unlink()


def _image_source(root: Path, n: int) -> None:
    if (root / "manifest.json").exists():
        return
    tmp = root.parent / f"{root.name}-build"
    _make_images(tmp, n)
    (tmp / "stoker").rename(root)
    (tmp / "data.parquet").unlink()
    tmp.rmdir()


def _single(sources: list[Path], root: Path) -> None:
    """One dataset over the sources' shard files (hard links) and one manifest."""
    from stoker.manifest import Manifest, ShardInfo, stoker_version

    if (root / "manifest.json").exists():
        return
    (root / "shards").mkdir(parents=True, exist_ok=True)
    shards, schema = [], None
    for k, src in enumerate(sources):
        m = Manifest.load(src)
        schema = m.arrow_schema
        for i, s in enumerate(m.shards):
            rel = f"shards/{k}-{i:05d}.arrow"
            os.link(m.shard_location(i), root / rel)
            shards.append(ShardInfo(rel, s.rows, s.bytes, s.xxh3_128, tuple(s.batch_rows)))
    Manifest.create(schema=schema, shards=shards, sources=[], options={},
                    stoker_version=stoker_version(), compression="none").save(root)


def _w1_data(workdir: Path, rows: int) -> tuple[list[Path], Path]:
    w1 = [workdir / f"w1-{rows}" / n for n in NAMES]
    for k, (path, part) in enumerate(zip(w1, SPLIT)):
        _w1_source(path, rows // sum(SPLIT) * part, seed=k)
    _single(w1, workdir / f"w1-{rows}" / "single")
    return w1, workdir / f"w1-{rows}" / "single"


def prepare(workdir: Path, rows: int, images: int) -> dict[str, Any]:
    unit_images = images // sum(SPLIT)
    w2 = [workdir / f"img-{images}" / n for n in NAMES]
    for path, part in zip(w2, SPLIT):
        _image_source(path, unit_images * part)
    _single(w2, workdir / f"img-{images}" / "single")
    return {"w1": _w1_data(workdir, rows), "images": (w2, workdir / f"img-{images}" / "single")}


# -- cases -----------------------------------------------------------------------------------
def _options(workload: str) -> dict[str, Any]:
    from stoker.loader import ImageOptions, ReadOptions

    if workload == "w1":
        return dict(batch_size=1024, columns=["seq", "label"],
                    read=ReadOptions(features=FEATURES, categoricals=CATS))
    return dict(batch_size=256, columns=["label"],
                read=ReadOptions(image=ImageOptions("jpg", size=(64, 64))))


def _epoch_rate(make: Callable[[], Any], epochs: int) -> float:
    """Median rows/s of epochs 1..``epochs`` of a fresh loader (epoch 0 is the untimed
    warm-up)."""
    return statistics.median(_interleaved({"one": make}, epochs)["one"])


def _interleaved(makers: dict[str, Callable[[], Any]], epochs: int) -> dict[str, list[float]]:
    """Rows/s of ``epochs`` timed epochs of each loader, all alive at once and taking turns
    epoch by epoch (who goes first alternates), after one untimed warm-up epoch each (it
    builds the records and warms the page cache). A W1 epoch of 600 k rows lasts ~0.06-0.1 s
    here, far shorter than the machine's swings (seconds): loaders timed one after the other
    read 76-125 % of each other in one run (session 19), taking turns ~80-88 %."""
    loaders = {name: make() for name, make in makers.items()}
    for dl in loaders.values():
        for _ in dl:
            pass
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    names = list(loaders)
    for epoch in range(1, epochs + 1):
        for name in names if epoch % 2 else names[::-1]:
            dl = loaders[name]
            dl.set_epoch(epoch)
            rows, t0 = 0, time.perf_counter()
            for batch in dl:
                rows += len(batch["label"])
            rates[name].append(rows / (time.perf_counter() - t0))
    for dl in loaders.values():
        dl.close()
    return rates


def run_pair(sources: list[Path], single: Path, workload: str, workers: int,
             epochs: int, rounds: int = 0) -> tuple[float, float]:
    """(mixture, single source) rows/s: medians of ``epochs`` epochs each, taking turns;
    with ``rounds``, ``rounds`` fresh loaders of each one after the other instead, each the
    median of its ``epochs``, and the medians of those (staged loaders beyond the records
    budget: an idle one's stager would stage its next round while the other is timed)."""
    from stoker.loader import DataLoader, Mixture

    opts = dict(_options(workload), shuffle=True, seed=0, num_workers=workers)
    mixture = Mixture({n: str(p) for n, p in zip(NAMES, sources)})  # weights ~ sizes
    makers = {"mixture": lambda: DataLoader(mixture, **opts),
              "single": lambda: DataLoader(single, **opts)}
    if not rounds:
        rates = _interleaved(makers, epochs)
        return statistics.median(rates["mixture"]), statistics.median(rates["single"])
    each: dict[str, list[float]] = {name: [] for name in makers}
    for _ in range(rounds):
        for name, make in makers.items():
            each[name].append(_epoch_rate(make, epochs))
    return statistics.median(each["mixture"]), statistics.median(each["single"])


def beyond(sources: list[Path], single: Path, workers: int,
           epochs: int) -> tuple[float, float, float]:
    """W1 whose records exceed the records budget, default options: (mixture, single source,
    mixture read from the columns), rows/s. Both loaders stage their rounds (checked); the
    third reads every row from the shards' columns, what a mixture beyond the budget read
    before stoker.loader.read.mixture_staging (one timed epoch after the warm-up)."""
    from stoker.loader import DataLoader, Mixture, ReadOptions
    from stoker.loader.read.mixture_staging import MixtureStager

    opts = dict(_options("w1"), shuffle=True, seed=0, num_workers=workers)
    mixture = Mixture({n: str(p) for n, p in zip(NAMES, sources)})
    probe = DataLoader(mixture, **opts)
    staged = isinstance(probe._source.readers[0].stager, MixtureStager)
    probe.close()
    if not staged:
        raise SystemExit("--beyond-rows: the mixture's records fit the records budget here, "
                         "so it stages nothing; use more rows")
    mixed, plain = run_pair(sources, single, "w1", workers, epochs, rounds=3)
    read = ReadOptions(features=FEATURES, categoricals=CATS, row_major=False)
    columns = _epoch_rate(lambda: DataLoader(mixture, **{**opts, "read": read}), 1)
    return mixed, plain, columns


def split(sources: list[Path], single: Path, repeats: int) -> dict[str, float]:
    """The order's CPU ms per epoch (mixture, single; process CPU: the mixture computes its
    chunks on a background thread) and the single reader's CPU ms per epoch for its own ids
    and for the mixture's (see the module docstring)."""
    from stoker.loader import DataLoader, Mixture
    from stoker.loader.order.mixture_order import source_order
    from stoker.loader.order.schedule import rank_batch_ids

    opts = dict(_options("w1"), shuffle=True, seed=0)
    mixture = Mixture({n: str(p) for n, p in zip(NAMES, sources)})
    loaders = {"mixture": DataLoader(mixture, **opts), "single": DataLoader(single, **opts)}
    reader = loaders["single"]._source
    if reader.stager is not None:  # it would read the mixture's ids from the columns
        raise SystemExit(f"--rows {int(reader.shard_rows.sum())}: the single source's records "
                         "exceed the records budget, so it stages rounds of its own order; "
                         "use fewer rows")
    for dl in loaders.values():  # untimed warm-up: records built, pages cached
        for _ in dl:
            pass
    reader.wait_row_major()  # no shard read from its columns while timed
    times: dict[str, list[float]] = {}
    for epoch in range(1, repeats + 1):
        ids = {}
        for name, dl in loaders.items():
            t0 = time.process_time()
            order = source_order(dl._source, dl.seed, epoch, dl.order_options)
            ids[name] = [rank_batch_ids(order, dl._plan, s) for s in range(len(dl))]
            times.setdefault(f"order CPU ms/epoch, {name}", []).append(time.process_time() - t0)
        for name in ("single", "mixture")[::1 if epoch % 2 else -1]:  # alternate who goes first
            t0 = time.thread_time()
            for batch in ids[name]:
                reader.fetch(batch, epoch, 0)
            times.setdefault(f"single-source reads CPU ms/epoch, {name} ids", []).append(
                time.thread_time() - t0)
    for dl in loaders.values():
        dl.close()
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def blend_figures() -> dict[str, Any]:
    from stoker.loader.order.blend import Blend

    rng = random.Random(0)
    out: dict[str, Any] = {}
    for n in (3, 7, 30, 100, 1000):
        blend = Blend([(0, [math.sqrt(2 + i) for i in range(n)])])
        blend.picks(0, 1024)
        t0 = time.perf_counter()
        for s in range(200):
            blend.picks(10**6 + s * 1024, 10**6 + (s + 1) * 1024)
        out[f"positions/s, {n} sources"] = 200 * 1024 / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        Blend([(0, [math.sqrt(2 + i) for i in range(n)])]).picks(10**10, 10**10 + 1024)
        out[f"random access at 1e10 (ms), {n} sources"] = 1e3 * (time.perf_counter() - t0)
    tracemalloc.start()
    blend = Blend([(0, [rng.uniform(0.5, 2.0) for _ in range(1000)])])
    for k in range(8):
        start = 10**10 + k * 10**8
        blend.picks(start, start + 1024)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    out["state peak (MB), 1000 sources at 1e10"] = peak / 2**20
    return out


# -- report ------------------------------------------------------------------------------------
def table(results: dict[tuple[str, int], tuple[float, float]], parts: dict[str, float],
          blend: dict[str, Any], staged: dict[int, tuple[float, float, float]],
          beyond_rows: int) -> str:
    lines = ["| workload | workers | mixture rows/s | single-source rows/s | ratio |",
             "|---|---:|---:|---:|---:|"]
    for (workload, workers), (mixed, plain) in results.items():
        lines.append(f"| {workload} | {workers} | {mixed:,.0f} | {plain:,.0f} | "
                     f"{100 * mixed / plain:.0f} % |")
    if staged:
        lines += ["", f"| W1 beyond the records budget ({beyond_rows:,} rows) | workers | "
                  "mixture rows/s (staged) | single-source rows/s (staged) | ratio | mixture "
                  "from the columns (before) |", "|---|---:|---:|---:|---:|---:|"]
        for workers, (mixed, plain, columns) in staged.items():
            lines.append(f"| W1 | {workers} | {mixed:,.0f} | {plain:,.0f} | "
                         f"{100 * mixed / plain:.0f} % | {columns:,.0f} |")
    lines += ["", "| W1, one thread: where the time goes | value |", "|---|---:|"]
    lines += [f"| {k} | {v:,.1f} |" for k, v in parts.items()]
    lines += ["", "| blend | value |", "|---|---:|"]
    lines += [f"| {k} | {v:,.2f} |" if v < 1000 else f"| {k} | {v:,.0f} |"
              for k, v in blend.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=600_000)
    ap.add_argument("--images", type=int, default=12_000)
    ap.add_argument("--repeats", type=int, default=5,
                    help="epochs whose order CPU and reads the W1 split times")
    ap.add_argument("--epochs", type=int, default=40,
                    help="timed epochs per loader, taking turns (median)")
    ap.add_argument("--beyond-epochs", type=int, default=5,
                    help="timed epochs per loader beyond the records budget (3 fresh loaders "
                         "of each, one after the other)")
    ap.add_argument("--workers", default="0,2", help="comma-separated thread worker counts")
    ap.add_argument("--beyond-rows", type=int, default=6_000_000,
                    help="W1 rows whose records exceed the records budget (0: skip)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/stoker-mixture-bench"))
    ap.add_argument("--no-write", action="store_true", help="do not touch bench/RESULTS.md")
    args = ap.parse_args(argv)
    data = prepare(args.workdir, args.rows, args.images)
    results = {}
    for workload, (sources, single) in data.items():
        for workers in (int(w) for w in args.workers.split(",")):
            results[(workload, workers)] = run_pair(sources, single, workload, workers,
                                                    args.epochs)
            mixed, plain = results[(workload, workers)]
            print(f"{workload} workers={workers}: mixture {mixed:,.0f} rows/s, single "
                  f"{plain:,.0f} rows/s ({100 * mixed / plain:.0f} %)", flush=True)
    staged = {}
    if args.beyond_rows:
        big = _w1_data(args.workdir, args.beyond_rows)
        for workers in (int(w) for w in args.workers.split(",")):
            staged[workers] = beyond(*big, workers, args.beyond_epochs)
            mixed, plain, columns = staged[workers]
            print(f"w1 beyond the budget workers={workers}: mixture {mixed:,.0f} rows/s, single "
                  f"{plain:,.0f} ({100 * mixed / plain:.0f} %), from the columns "
                  f"{columns:,.0f}", flush=True)
    parts = split(*data["w1"], args.repeats)
    blend = blend_figures()
    text = table(results, parts, blend, staged, args.beyond_rows)
    print(text)
    cmd = "`.venv/bin/python bench/mixture_bench.py " + " ".join(argv or sys.argv[1:]) + "`"
    header = (f"{cmd.replace(' `', '`')} on {platform.machine()}, {os.cpu_count()} CPUs, Python "
              f"{platform.python_version()}: the two loaders of a case alive together, taking "
              f"turns epoch by epoch, each rate the median of {args.epochs} epochs after a "
              f"warm-up one (beyond the records budget: 3 fresh loaders of each in turn, each "
              f"the median of {args.beyond_epochs} epochs, the medians of those); rows "
              f"split 1:2:3 over sources a, b, c (W1 {args.rows:,} rows, images "
              f"{args.images:,}; beyond the records budget {args.beyond_rows:,}). Taken on a "
              "machine shared with other work (numbers move with its load).")
    if not args.no_write:
        write_section("Mixtures", f"{header}\n\n{text}\n\n{NOTES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
