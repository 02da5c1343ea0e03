"""Writing records past the page cache: what a record file's save costs the CPU.

``.venv/bin/python bench/direct_save_bench.py [--mib 235] [--repeats 5] [--idle 3] [--write]``
saves ``--mib`` MiB of records, built in fresh pages as a first run builds them, with
``RecordStore.save`` through the page cache ("cached": the loader before this bench) and
past it (``direct=True``: ``O_DIRECT``, then the low-priority helper process reads the file
into the cache), the two in turn within each repeat, in the records directory's filesystem
(``--dir``, default the node's records directory), from a thread niced as the loader's saver
is. Reports medians of the save's wall time, the saving thread's CPU, the helper's CPU and
the share of the file in the page cache once the save returned, and the cached / direct
ratio of the CPU the save takes (saving thread and helper). On a machine of two cores, that
CPU is taken from the batches of the first run that builds the records.

Each save waits ``--idle`` seconds first, and its file is deleted after: on a VM whose guest
reports free pages to the host, pages left free for ~2 s cost ~20x more to touch again
(bench/fresh_memory.py), and a node's first run writes into such pages.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import write_section  # noqa: E402

from stoker.loader.fastpath.advise import cached_pages  # noqa: E402
from stoker.loader.fastpath.record_store import RecordStore, default_dir  # noqa: E402
from stoker.loader.fastpath.ring import fresh_pages  # noqa: E402
from stoker.loader.fastpath.shard_records import lower_priority  # noqa: E402

MODES = ("cached", "direct")


def save_once(store: RecordStore, nbytes: int, direct: bool, name: str) -> dict[str, float]:
    """Save ``nbytes`` of records in fresh pages once (a file deleted afterwards)."""
    records = fresh_pages(nbytes)  # faulted in, as a build faults its tiles in
    records[:] = 7
    lower_priority()  # this thread saves, as the loader's saver thread does
    c0 = time.thread_time()
    k0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    if not store.save(name, records, direct=direct):
        raise RuntimeError(f"{store.path(name)} was not written (no room in {store.root}?)")
    wall = time.perf_counter() - t0
    cpu = time.thread_time() - c0
    k1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    helper = (k1.ru_utime + k1.ru_stime) - (k0.ru_utime + k0.ru_stime)
    out = {"wall_s": wall, "saver_cpu_s": cpu, "helper_cpu_s": helper,
           "resident": _share(cached_pages(store.path(name)))}
    os.unlink(store.path(name))
    Path(store.path(name) + ".lock").unlink(missing_ok=True)  # the save's lock file
    return out


def _share(pages: np.ndarray | None) -> float:
    return float("nan") if pages is None else float(pages.mean())


def measure(directory: str, nbytes: int, repeats: int, idle: float) -> dict[str, list[dict]]:
    """Every mode ``repeats`` times, in turn, each save ``idle`` seconds after the last."""
    store = RecordStore(directory)
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(repeats):
        for mode in MODES:
            time.sleep(idle)
            got = save_once(store, nbytes, mode == "direct", f"bench-{os.getpid()}-{r}-{mode}.rec")
            runs[mode].append(got)
            print(mode, {k: round(v, 3) for k, v in got.items()}, flush=True)
    return runs


def table(runs: dict[str, list[dict]]) -> str:
    med = {m: {k: statistics.median(r[k] for r in runs[m]) for k in runs[m][0]} for m in MODES}
    lines = ["| save | wall s | saving thread CPU s (min-max) | helper CPU s | file in page "
             "cache after |", "|---|---:|---:|---:|---:|"]
    for m in MODES:
        v, cpus = med[m], [r["saver_cpu_s"] for r in runs[m]]
        lines.append(f"| {m} | {v['wall_s']:.3f} | {v['saver_cpu_s']:.3f} ({min(cpus):.3f}-"
                     f"{max(cpus):.3f}) | {v['helper_cpu_s']:.3f} | {v['resident']:.0%} |")
    cpu = {m: med[m]["saver_cpu_s"] + med[m]["helper_cpu_s"] for m in MODES}
    worst = {m: max(r["saver_cpu_s"] + r["helper_cpu_s"] for r in runs[m]) for m in MODES}
    lines.append(f"\nCPU of a save (saving thread and helper), cached / direct: "
                 f"{cpu['cached'] / max(cpu['direct'], 1e-9):.1f}x the medians, "
                 f"{worst['cached'] / max(worst['direct'], 1e-9):.1f}x the slowest of each.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=235, help="MiB of records per save (a W1 "
                                                        "shard of 500,000 rows: 235)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--idle", type=float, default=3.0, help="seconds before each save")
    p.add_argument("--dir", default=None, help="records directory (default: the node's)")
    p.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    args = p.parse_args(argv)
    if args.mib < 1 or args.repeats < 1 or args.idle < 0:
        p.error(f"--mib and --repeats must be >= 1 and --idle >= 0, got {args.mib}, "
                f"{args.repeats}, {args.idle}")
    directory = args.dir or default_dir()
    if not directory:
        p.error("no records directory: pass --dir")
    os.makedirs(directory, exist_ok=True)
    runs = measure(directory, args.mib << 20, args.repeats, args.idle)
    text = (f"`.venv/bin/python bench/direct_save_bench.py --mib {args.mib} --repeats "
            f"{args.repeats} --idle {args.idle:g}` — {platform.machine()}, {os.cpu_count()} "
            f"cores, kernel {platform.release()}, load average {os.getloadavg()[0]:.1f}; "
            f"medians of {args.repeats}, {args.mib} MiB of records in fresh pages per save, "
            f"the two kinds of save in turn.\n\n" + table(runs))
    print(text)
    if args.write:
        write_section("Writing records past the page cache", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
