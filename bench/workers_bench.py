"""Workers: does stoker's throughput grow (never shrink) with ``num_workers``, threads and
processes, shuffle on and off, on a node's first run and on later runs, beside the ceiling?

One command (``.venv/bin/python bench/workers_bench.py --rows 2000000 [--images 50000]
[--repeats 3] [--write]``) builds W1 (and W2) with bench/loader_bench.py's generators under
``--workdir``, then runs every case in a fresh process, interleaved within each repeat, and
reports medians:

- W1 (64 f32 features, 8 int64 categoricals, list<f32>[16], label; batch 1024): stoker with
  ``num_workers`` 0/1/2 x ``WorkerOptions(mode=thread|process)`` x shuffle on/off, *first run*
  (an empty records directory: the node has never read the data), *second run* (the same
  configuration's first run, untimed, just before: what a user who always runs that
  configuration gets the next time) and *later run* (the records of every shard on disk: an
  untimed run waits until they are built and saved), and *sustained* (the later run's
  records, one loader with persistent workers reading ``EPOCHS`` epochs in one process: the
  rate of its last ``STEADY`` epochs, what a long training run gets once started, and of all
  of them from the loader's construction on); the ceiling
  is Parquet -> NumPy of every column, one core, no shuffle (bench/loader_bench.py's
  ``_ceiling_w1``).
- W2 (64x64 JPEGs, batch 256): stoker with ``num_workers`` 0/1/2, threads and processes,
  shuffle on; decode ceilings of one core with Pillow and with simplejpeg.

``--write`` replaces the "Workers" section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import loader_bench as lb  # noqa: E402


def _decode_ceiling(d: Path, decoder: str) -> Iterator[Any]:
    """One core decoding every JPEG of W2 into a reused [n, 64, 64, 3] buffer."""
    import io

    import numpy as np
    import pyarrow.parquet as pq

    import simplejpeg
    from PIL import Image

    def pil(blob: bytes, out: np.ndarray) -> None:
        out[...] = np.asarray(Image.open(io.BytesIO(blob)).convert("RGB"))

    def sj(blob: bytes, out: np.ndarray) -> None:
        simplejpeg.decode_jpeg(blob, colorspace="RGB", buffer=out)

    decode = sj if decoder == "simplejpeg" else pil
    f = pq.ParquetFile(d / "data.parquet")
    for g in range(f.num_row_groups):
        blobs = f.read_row_group(g, columns=["jpg"]).column("jpg").to_pylist()
        pixels = np.empty((len(blobs), lb.SIDE, lb.SIDE, 3), np.uint8)
        for i, b in enumerate(blobs):
            decode(b, pixels[i])
        yield {"label": np.empty(len(blobs)), "jpg": pixels}


EPOCHS = 10  # epochs of a sustained case
STEADY = 3  # its last epochs, whose median rate is the steady one
# runs of a ceiling case per repeat: one run read 0.85-3.5 M W1 rows/s here (session 26), and
# every ratio of the table divides by its median
CEILING_RUNS = 3


RUNS = ("first", "second", "later", "sustained")


def cases(images: bool, runs: tuple[str, ...] = RUNS) -> list[str]:
    out = []
    for run in runs:
        for shuffle in ("on", "off"):
            for mode in ("thread", "process"):
                for workers in (0, 1, 2):
                    if workers == 0 and mode == "process":
                        continue  # no workers: the mode does not apply
                    out.append(f"w1/{run}/shuffle {shuffle}/{mode}/{workers}")
    out.append("w1/ceiling/parquet->numpy/-/1")
    if images:
        for mode in ("thread", "process"):
            for workers in (0, 1, 2):
                if workers == 0 and mode == "process":
                    continue
                out.append(f"w2/later/shuffle on/{mode}/{workers}")
        out += ["w2/ceiling/PIL/-/1", "w2/ceiling/simplejpeg/-/1"]
    return out


def run_case(name: str, data: Path) -> dict[str, float]:
    """One case to the end of its epoch in this process (libraries imported untimed)."""
    import pyarrow.parquet  # noqa: F401
    import torch.utils.data  # noqa: F401

    import stoker.loader.dataloader  # noqa: F401

    workload, run, shuffle, mode, workers = name.split("/")
    d = data / workload
    t0 = time.perf_counter()
    if run == "records":
        return _records(d, shuffle == "shuffle on")
    if run == "sustained":
        return _sustained(d, int(workers), mode, shuffle == "shuffle on", t0)
    if run == "ceiling":
        it = lb._ceiling_w1(d) if workload == "w1" else _decode_ceiling(d, shuffle)
    elif workload == "w1":
        it = lb._stoker_w1(d, int(workers), mode=mode, shuffle=shuffle == "shuffle on")
    else:
        it = lb._stoker_w2(d, int(workers), mode=mode)
    n = 0
    for b in it:
        n += len(b["label"])
    seconds = time.perf_counter() - t0
    return {"samples": n, "seconds": seconds, "samples_per_s": n / seconds}


def _sustained(d: Path, workers: int, mode: str, shuffle: bool, t0: float) -> dict[str, float]:
    """``EPOCHS`` epochs of one loader (persistent workers): ``samples_per_s``, the median
    rate of the last ``STEADY``; ``overall``, every epoch's rows over the time since ``t0``
    (construction, start-up and any kernel switch included)."""
    loader = lb._stoker_w1_loader(d, workers, mode=mode, shuffle=shuffle, persistent=True)
    rates, n = [], 0
    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)
        start, rows = time.perf_counter(), 0
        for b in loader:
            rows += len(b["label"])
        rates.append(rows / (time.perf_counter() - start))
        n += rows
    seconds = time.perf_counter() - t0
    loader.close()
    return {"samples": n, "seconds": seconds, "samples_per_s": statistics.median(rates[-STEADY:]),
            "overall": n / seconds}


def _records(d: Path, shuffle: bool) -> dict[str, float]:
    """Untimed: an epoch, then wait until every shard's records are built and saved. A
    process that exits first leaves the records it had not finished unsaved, and "later" runs
    would then read those shards from their columns."""
    loader = lb._stoker_w1_loader(d, 0, shuffle=shuffle)
    for _ in loader:
        pass
    loader._source.wait_row_major()
    loader.close()
    return {"samples": 0, "seconds": 0.0, "samples_per_s": 0.0}


def _cached(*roots: Path) -> None:
    """Untimed, before a case: read every file under ``roots`` once, so that every case
    starts with its dataset (and a later case with the records) in the page cache, whatever
    the cases before it evicted. A first run writes a fresh records directory (~500 MB per
    million W1 rows), and at 5 M rows the later case that ran first after them read its
    records back from the disk: 3.4-3.6 M rows/s against 6.7 M (session 37). Mapped as the
    loader maps a record file (``record_store._map_records``: advised ``MADV_HUGEPAGE``, then
    populated), so a file read back from the disk comes in the same 2 MB folios."""
    from stoker.loader.fastpath.record_store import _map_records

    for root in roots:
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            size = path.stat().st_size
            if size:
                fd = os.open(path, os.O_RDONLY)
                try:
                    _map_records(fd, size, path.name).close()
                finally:
                    os.close(fd)


def _spawn(name: str, data: Path, records: Path) -> dict[str, float]:
    """Case ``name`` in a fresh process; a first run gets an empty records directory, a later
    run the directory a first run filled (``records``), a second run the directory its own
    configuration's first run (untimed, just before) left."""
    own = "/first/" in name or "/second/" in name
    empty = tempfile.mkdtemp(prefix="stoker-workers-records-") if own else None
    env = {**os.environ, "STOKER_ROW_MAJOR_DIR": empty or str(records)}
    runs = [name.replace("/second/", "/first/"), name] if "/second/" in name else [name]
    try:
        for case in runs:
            out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--case",
                                  case, "--data", str(data)], capture_output=True, text=True,
                                 env=env, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        if empty:
            shutil.rmtree(empty, ignore_errors=True)


def table(medians: dict[str, float]) -> str:
    lines = []
    ceiling = medians.get("w1/ceiling/parquet->numpy/-/1")
    lines += ["W1 rows/s (ratio to the Parquet -> NumPy ceiling of one core, "
              f"{ceiling:,.0f} rows/s):", "",
              "| run | shuffle | mode | 0 workers | 1 worker | 2 workers |",
              "|---|---|---|---:|---:|---:|"]
    # (label, run, suffix of the medians' key: "#overall" is a sustained case's second figure)
    rows = [(run, run, "") for run in ("first", "second", "later")] + \
        [(f"sustained: last {STEADY} of {EPOCHS} epochs", "sustained", ""),
         (f"sustained: all {EPOCHS} epochs", "sustained", "#overall")]
    for label, run, suffix in rows:
        if f"w1/{run}/shuffle on/thread/0" not in medians:  # not asked for (--runs)
            continue
        for shuffle in ("on", "off"):
            for mode in ("thread", "process"):
                cells = []
                for workers in (0, 1, 2):
                    key = f"w1/{run}/shuffle {shuffle}/{mode if workers else 'thread'}/{workers}"
                    v = medians[key + suffix]
                    cells.append(f"{v:,.0f} ({v / ceiling:.2f}x)")
                lines.append(f"| {label} | {shuffle} | {mode} | " + " | ".join(cells) + " |")
    if "w2/ceiling/PIL/-/1" in medians:
        pil, sj = medians["w2/ceiling/PIL/-/1"], medians["w2/ceiling/simplejpeg/-/1"]
        lines += ["", f"W2 images/s, shuffle on (decode ceilings of one core: Pillow {pil:,.0f}, "
                  f"simplejpeg {sj:,.0f}; two cores: {2 * sj:,.0f}):", "",
                  "| mode | 0 workers | 1 worker | 2 workers |", "|---|---:|---:|---:|"]
        for mode in ("thread", "process"):
            keys = [f"w2/later/shuffle on/{mode if w else 'thread'}/{w}" for w in (0, 1, 2)]
            cells = [f"{medians[k]:,.0f}" for k in keys]
            lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--images", type=int, default=0, help="W2 images (0: skip W2)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/stoker-loader-bench"))
    ap.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS),
                    help="which W1 runs (default: all); e.g. first runs alone, repeated more")
    ap.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.case:
        print(json.dumps(run_case(args.case, args.data)))
        return 0
    runs = tuple(r for r in RUNS if r in args.runs)  # each once, in the table's order
    if args.write and runs != RUNS:
        ap.error("--write replaces the whole Workers section: give every run (no --runs)")
    lb.prepare(args.workdir, args.rows, args.images or 1)
    data = Path(tempfile.mkdtemp(prefix="stoker-workers-"))
    (data / "w1").symlink_to(args.workdir / f"w1-{args.rows}")
    (data / "w2").symlink_to(args.workdir / f"w2-{args.images or 1}")
    records = Path(tempfile.mkdtemp(prefix="stoker-workers-records-"))
    names = cases(bool(args.images), runs)
    if {"later", "sustained"} & set(runs):
        _spawn("w1/records/shuffle on/thread/0", data, records)  # untimed: records on disk
    if args.images:
        _spawn("w2/later/shuffle on/thread/0", data, records)
    runs: dict[str, list[float]] = {n: [] for n in names}
    runs.update({n + "#overall": [] for n in names if "/sustained/" in n})
    try:
        for r in range(args.repeats):
            for n in names:
                for _ in range(CEILING_RUNS if "/ceiling/" in n else 1):
                    later = "/later/" in n or "/sustained/" in n
                    _cached(data / n.split("/")[0], *([records] if later else []))
                    got = _spawn(n, data, records)
                    runs[n].append(got["samples_per_s"])
                    if "overall" in got:
                        runs[n + "#overall"].append(got["overall"])
                    print(f"[{r + 1}/{args.repeats}] {n}: {runs[n][-1]:,.0f}/s", file=sys.stderr)
    finally:
        shutil.rmtree(records, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)
    medians = {n: statistics.median(v) for n, v in runs.items()}
    load = os.getloadavg()
    cmd = "`.venv/bin/python bench/workers_bench.py " + " ".join(argv or sys.argv[1:]) + "`"
    text = (f"{cmd} — {platform.machine()}, {os.cpu_count()} cores, load average "
            f"{load[0]:.1f}/{load[1]:.1f} at the end, Python {platform.python_version()}; "
            f"W1 {args.rows:,} rows; medians of {args.repeats} fresh processes per case "
            f"({CEILING_RUNS * args.repeats} for a ceiling), "
            "interleaved; timed from the loader's construction to the end of the epoch "
            "(sustained: see the module's docstring).\n\n"
            + table(medians) + "\n")
    print(text)
    if args.write:
        results = HERE / "RESULTS.md"
        old = results.read_text(encoding="utf-8")
        section = f"## Workers ({args.rows:,} W1 rows)\n\n" + text
        pattern = rf"## Workers \({args.rows:,} W1 rows\)\n.*?(?=\n## |\Z)"
        new = re.sub(pattern, section.rstrip("\n") + "\n", old, flags=re.S) \
            if re.search(pattern, old, flags=re.S) else old.rstrip("\n") + "\n\n" + section
        results.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
