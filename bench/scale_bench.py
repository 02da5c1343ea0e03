"""How rows/s, memory and derived data grow with the dataset: stoker vs a pyarrow baseline.

Run (the command behind bench/RESULTS.md, "Scale"):

    .venv/bin/python bench/scale_bench.py --sizes 2000000,5000000,10000000,20000000 \
        --memory-limit 6GiB

W1-shaped data (64 float32 features, 8 int64 categoricals, list<float32>[16], int64 label;
batch 1024, shuffle on, default options) at each size, every case in a fresh process:

- ``stoker node first``: an empty records directory (``<workdir>/w1-<rows>/stoker-records``,
  one per size) and the page cache dropped: a node's first run, which builds the records it
  keeps (per-shard records within the records budget; past memory, each staged shard's
  records, stoker.loader.read.staged_files); builds still queued when the epoch ends are
  cancelled;
- ``stoker first``: the page cache is dropped first (root only; otherwise said in the table),
  so the shards are read from disk, with what the node's earlier runs kept;
- ``stoker later``: the same again right after (a later run on the node);
- ``baseline``: a pyarrow row-group loader over the same rows in Parquet (row groups in a
  seeded random order, rows shuffled inside each group, batches of 1024 stacked to NumPy):
  the naive loader a user writes first; cold (cache dropped) and warm;
- ``index``: the same Parquet indexed in place (``stoker index``) read by the DataLoader;
  ``index first`` with an empty records directory (and the page cache dropped): the node's
  first run, which saves the row groups' records; ``index later`` maps them;
- ``index natural`` / ``baseline natural``: the same with shuffle off (the baseline reads
  row groups in file order and does not permute rows), in a second table.

Each case runs ``--repeats`` times (3, in turn with the others) and reports its median run:
rows/s over the epoch (or over the first ``--max-seconds`` of it; the clock starts after
``import torch``, which a training process has done anyway, and the baseline hands out
tensors too: ``torch.from_numpy``, no copy), peak RSS of the process, and bytes of derived
data the loader left on disk (the record files in each records directory after the runs);
the range of the runs is printed beneath the table.
``--memory-limit`` runs the largest size's cases in a memory cgroup of that size (page cache
included), which makes that dataset larger than the memory the loader can use: the machine's 24 GiB of RAM and its free
disk cannot hold a W1 dataset larger than RAM twice (Parquet for the baseline + shards).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

BATCH = 1024
FEATURES = [f"f{i}" for i in range(64)]
CATS = [f"c{i}" for i in range(8)]
CGROUP = Path("/sys/fs/cgroup/memory/stoker-scale-bench")


def prepare(workdir: Path, rows: int) -> Path:
    """Parquet, a stoker dataset and an in-place index of the Parquet, built once per size."""
    from stoker.sharder import shard
    from stoker.sharder.index import index
    from stoker.sharder.synthetic import write_tabular_parquet

    d = workdir / f"w1-{rows}"
    d.mkdir(parents=True, exist_ok=True)
    if not (d / "parquet" / "data.parquet").exists():
        (d / "parquet").mkdir(exist_ok=True)
        write_tabular_parquet(d / "parquet" / "tmp.parquet", rows)
        os.replace(d / "parquet" / "tmp.parquet", d / "parquet" / "data.parquet")
    if not (d / "stoker" / "manifest.json").exists():
        shard(str(d / "parquet" / "data.parquet"), str(d / "stoker"), progress=False,
              overwrite=True)
    if not (d / "parquet" / "manifest.json").exists():
        index(str(d / "parquet"))
    return d


# -- cases (run in a child process) -------------------------------------------------------------
def _stoker(path: Path, shuffle: bool = True) -> Iterator[Any]:
    from stoker.loader import DataLoader, ReadOptions

    loader = DataLoader(str(path), batch_size=BATCH, shuffle=shuffle, seed=0,
                        columns=["seq", "label"],
                        read=ReadOptions(features=FEATURES, categoricals=CATS))
    yield from loader


def _baseline(path: Path, shuffle: bool = True) -> Iterator[Any]:
    import pyarrow.parquet as pq
    import torch

    f = pq.ParquetFile(path / "parquet" / "data.parquet")
    rng = np.random.default_rng(0)
    for g in rng.permutation(f.num_row_groups) if shuffle else range(f.num_row_groups):
        t = f.read_row_group(int(g))
        perm = rng.permutation(t.num_rows) if shuffle else slice(None)
        feats = np.stack([t.column(c).to_numpy() for c in FEATURES], 1)[perm]
        cats = np.stack([t.column(c).to_numpy() for c in CATS], 1)[perm]
        seq = t.column("seq").combine_chunks().flatten().to_numpy().reshape(t.num_rows, -1)[perm]
        label = t.column("label").to_numpy()[perm]
        for lo in range(0, t.num_rows, BATCH):  # tensors, as a torch training loop takes them
            yield {"features": torch.from_numpy(feats[lo:lo + BATCH]),
                   "categoricals": torch.from_numpy(cats[lo:lo + BATCH]),
                   "seq": torch.from_numpy(seq[lo:lo + BATCH]),
                   "label": torch.from_numpy(label[lo:lo + BATCH])}


def _derived_bytes() -> int:
    from stoker.loader.fastpath.record_store import default_dir

    root = Path(default_dir(None))
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.exists() else 0


def child(case: str, data: Path, max_seconds: float) -> dict[str, float]:
    """Run one case; rows/s over what was read before the time limit (or the whole epoch).
    torch is imported before the clock starts, for every case: a training process has it
    loaded before it builds its data loader (stoker's own import is timed)."""
    import torch  # noqa: F401 - see the docstring

    before = _derived_bytes()
    t0 = time.perf_counter()
    it = {"stoker": lambda: _stoker(data / "stoker"), "index": lambda: _stoker(data / "parquet"),
          "baseline": lambda: _baseline(data),
          "index-natural": lambda: _stoker(data / "parquet", shuffle=False),
          "baseline-natural": lambda: _baseline(data, shuffle=False)}[case]()
    rows = 0
    for batch in it:
        rows += len(batch["label"])
        if time.perf_counter() - t0 > max_seconds:
            break
    dt = time.perf_counter() - t0
    return {"rows": rows, "seconds": dt, "rows_per_s": rows / dt,
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "derived_bytes": _derived_bytes() - before}


# -- parent -------------------------------------------------------------------------------------
def _drop_caches() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def _cgroup(limit: int | None) -> Any:
    if limit is None:
        return None
    CGROUP.mkdir(exist_ok=True)
    (CGROUP / "memory.limit_in_bytes").write_text(str(limit))

    def enter() -> None:
        (CGROUP / "cgroup.procs").write_text(str(os.getpid()))
    return enter


def spawn(case: str, data: Path, max_seconds: float, limit: int | None,
          records: Path | None = None) -> dict[str, float]:
    """Case ``case`` in a fresh process (in the cgroup of ``limit``); ``records``: its
    records directory instead of the node's default one."""
    cmd = [sys.executable, __file__, "--child", case, "--data", str(data),
           "--max-seconds", str(max_seconds)]
    env = None if records is None else {**os.environ, "STOKER_ROW_MAJOR_DIR": str(records)}
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         preexec_fn=_cgroup(limit), env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


# (name, case, page cache dropped first, records directory emptied first: a node's first run)
CASES = (("baseline cold", "baseline", True, False), ("stoker node first", "stoker", True, True),
         ("stoker first", "stoker", True, False), ("stoker later", "stoker", False, False),
         ("baseline warm", "baseline", False, False), ("index first", "index", True, True),
         ("index later", "index", False, False),
         ("baseline natural cold", "baseline-natural", True, False),
         ("index natural first", "index-natural", True, True),
         ("index natural later", "index-natural", False, False),
         ("baseline natural warm", "baseline-natural", False, False))


def run_size(workdir: Path, rows: int, max_seconds: float, limit: int | None,
             repeats: int, only: set[str] | None = None) -> dict[str, Any]:
    """Every case ``repeats`` times (the cases in turn, then again: the machine's drift
    spreads over all of them); each case's median run by rows/s, with the range seen."""
    data = prepare(workdir, rows)
    shard_bytes = sum(p.stat().st_size for p in (data / "stoker").rglob("*.arrow"))
    res: dict[str, Any] = {"rows": rows, "shard_bytes": shard_bytes, "memory_limit": limit}
    cases = [c for c in CASES if only is None or c[0] in only]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _, _ in cases}
    # each size its own: a node-first case empties its directory
    records = {"index": data / "index-records", "stoker": data / "stoker-records",
               "index-natural": data / "index-records"}
    for _ in range(repeats):
        for name, case, cold, fresh in cases:
            if fresh:
                shutil.rmtree(records[case], ignore_errors=True)
            dropped = _drop_caches() if cold else False
            r = spawn(case, data, max_seconds, limit, records.get(case))
            r["cache_dropped"] = dropped
            runs[name].append(r)
            for kind, where in records.items():
                if kind == "index-natural":
                    continue
                res[f"{kind}_records_bytes"] = sum(p.stat().st_size for p in where.glob("*.rec"))
            print(f"{rows:>11,} {name:<14} {r['rows_per_s'] / 1e6:6.2f} M rows/s  "
                  f"peak RSS {r['peak_rss'] / 2**20:7.0f} MiB  derived "
                  f"{r['derived_bytes'] / 2**20:6.0f} MiB  ({r['rows']:,} rows in "
                  f"{r['seconds']:.1f} s{', cold' if dropped else ''})", flush=True)
    for name, got in runs.items():
        got.sort(key=lambda r: r["rows_per_s"])
        res[name] = {**got[len(got) // 2], "low": got[0]["rows_per_s"],
                     "high": got[-1]["rows_per_s"]}
    return res


def _rate(r: dict[str, Any], k: str) -> str:
    return f"{r[k]['rows_per_s'] / 1e6:.2f} M" if k in r else "-"


def _ratio(r: dict[str, Any], a: str, b: str) -> str:
    return f"{r[a]['rows_per_s'] / r[b]['rows_per_s']:.2f}x" if a in r and b in r else "-"


def table(results: list[dict[str, Any]]) -> str:
    """Medians of each case (rows/s; the range of the runs beneath the table)."""
    head = ("| rows | shards GB | memory | stoker node first | stoker first | stoker later | "
            "baseline cold | baseline warm | node first / cold base | first / cold base | "
            "later / warm base | index first | index later | "
            "index first / cold base | index later / warm base | peak RSS stoker | "
            "derived data: stoker | derived data: index |")
    lines = [head, "|" + "---:|" * 18]
    ranges = [f"{r['rows']:,}: " + ", ".join(
        f"{name} {r[name]['low'] / 1e6:.2f}-{r[name]['high'] / 1e6:.2f}"
        for name, _, _, _ in CASES if name in r) for r in results]
    shuffled = [name for name, _, _, _ in CASES if "natural" not in name]
    for r in results:
        if not any(name in r for name in shuffled):
            continue
        later = r.get("stoker later")
        rss = f"{later['peak_rss'] / 2**20:.0f} MiB" if later else "-"
        mem = f"{r['memory_limit'] / 2**30:.0f} GiB cgroup" if r["memory_limit"] else "24 GiB"
        lines.append(
            f"| {r['rows']:,} | {r['shard_bytes'] / 1e9:.1f} | {mem} | "
            f"{_rate(r, 'stoker node first')} | {_rate(r, 'stoker first')} | "
            f"{_rate(r, 'stoker later')} | {_rate(r, 'baseline cold')} | "
            f"{_rate(r, 'baseline warm')} | {_ratio(r, 'stoker node first', 'baseline cold')} | "
            f"{_ratio(r, 'stoker first', 'baseline cold')} | "
            f"{_ratio(r, 'stoker later', 'baseline warm')} | "
            f"{_rate(r, 'index first')} | {_rate(r, 'index later')} | "
            f"{_ratio(r, 'index first', 'baseline cold')} | "
            f"{_ratio(r, 'index later', 'baseline warm')} | "
            f"{rss} | {r.get('stoker_records_bytes', 0) / 2**30:.2f} GiB | "
            f"{r.get('index_records_bytes', 0) / 2**30:.2f} GiB |")
    natural = ["", "Natural order (shuffle off; the baseline reads row groups in file order, "
               "rows unshuffled):", "",
               "| rows | memory | index natural first | index natural later | "
               "baseline natural cold | baseline natural warm | first / cold base | "
               "later / warm base |", "|" + "---:|" * 8]
    for r in results:
        if not any(name in r for name in ("index natural first", "index natural later")):
            continue
        mem = f"{r['memory_limit'] / 2**30:.0f} GiB cgroup" if r["memory_limit"] else "24 GiB"
        natural.append(
            f"| {r['rows']:,} | {mem} | {_rate(r, 'index natural first')} | "
            f"{_rate(r, 'index natural later')} | {_rate(r, 'baseline natural cold')} | "
            f"{_rate(r, 'baseline natural warm')} | "
            f"{_ratio(r, 'index natural first', 'baseline natural cold')} | "
            f"{_ratio(r, 'index natural later', 'baseline natural warm')} |")
    lines = lines if len(lines) > 2 else []  # natural-order cases only
    return "\n".join(lines + (natural if len(natural) > 5 else [])
                     + ["", "Range of the runs (M rows/s):"] + ranges)


def _size(text: str) -> int:
    units = {"kib": 2**10, "mib": 2**20, "gib": 2**30}
    for u, f in units.items():
        if text.lower().endswith(u):
            return int(float(text[: -len(u)]) * f)
    return int(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="2000000,5000000,10000000,20000000")
    p.add_argument("--workdir", default="/tmp/stoker-scale")
    p.add_argument("--max-seconds", type=float, default=60.0)
    p.add_argument("--repeats", type=int, default=3, help="runs of each case (median shown)")
    p.add_argument("--memory-limit", default=None, help="cgroup limit for the largest size")
    p.add_argument("--prepare-only", action="store_true", help="build the datasets and stop")
    p.add_argument("--cases", default=None,
                   help="comma-separated case names to run (default: all; the table shows - "
                        "for the others)")
    p.add_argument("--child", default=None)
    p.add_argument("--data", default=None)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, Path(args.data), args.max_seconds)))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.prepare_only:
        for n in sizes:
            prepare(Path(args.workdir), n)
        return 0
    limit = _size(args.memory_limit) if args.memory_limit else None
    print(f"# {platform.node()} {os.cpu_count()} CPUs, {platform.python_version()}; "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    results = [run_size(Path(args.workdir), n, args.max_seconds,
                        limit if n == max(sizes) else None, args.repeats,
                        set(args.cases.split(",")) if args.cases else None) for n in sizes]
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
