"""Loader peers: stoker vs Mosaic Streaming vs LitData vs the torch baseline, in one run.

One command, with the peers' own venv (it holds mosaicml-streaming and litdata next to
torch 2.13.0+cpu and stoker; bench/peers-requirements.txt says how it was built)::

    nice -n 19 /work/peers-venv/bin/python bench/peers_bench.py --repeats 3

It reuses bench/loader_bench.py's data and cases on a smaller size (W1 ``--rows`` 200,000
tabular rows, W2 ``--images`` 5,000 64x64 JPEGs, both under ``--workdir``), converts each
workload once into each peer's format (timed, in a fresh process: Mosaic ``MDSWriter`` with
fixed-size ``ndarray`` columns, LitData ``optimize()``), then reads one shuffled epoch per
case (batch 1024 / 256, workers 0 and 2), every case in a fresh process, the cases
interleaved within each of ``--repeats`` rounds; medians are printed as one Markdown table.

Outputs are the same for every contender: W1 features [B,64] f32, cats [B,8] i64, seq
[B,16] f32, label [B] i64; W2 jpg uint8 [B,64,64,3], label [B] i64 (checked on the first
batch). Timing starts after every library the case uses is imported, at the loader's
construction, and includes the time to the first batch.

No torchvision build matching torch 2.13.0+cpu exists on the package index (0.28.0 is a CUDA
build whose extension cannot load), so: both peers' JPEGs are stored as raw bytes and
decoded with Pillow, as the torch baseline does (LitData's JPEG serializer decodes with
torchvision.io; Mosaic's ``jpeg`` encoding is ``PIL.Image.open`` and would re-encode the
bytes at quality 75 on write); and ``import streaming`` imports ``streaming.vision``, which
imports torchvision at module level, so Mosaic processes get a stand-in ``torchvision``
module whose functions raise if called (the MDS writer/reader never call them).
"""

from __future__ import annotations

import argparse
import importlib.machinery
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import types
import warnings
from pathlib import Path
from typing import Any, Iterator

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import loader_bench as lb  # noqa: E402  (bench/ is not a package)

WORKDIR = Path("/tmp/stoker-peers")
PEERS = ("mosaic", "litdata")
W1_COLUMNS = {"features": "ndarray:float32:64", "cats": "ndarray:int64:8",
              "seq": "ndarray:float32:16", "label": "int64"}
W2_COLUMNS = {"jpg": "bytes", "label": "int64"}
EXPECTED = {  # output name -> (dtype, shape after the batch dimension)
    "w1": {"features": ("float32", (64,)), "cats": ("int64", (8,)),
           "seq": ("float32", (16,)), "label": ("int64", ())},
    "w2": {"jpg": ("uint8", (lb.SIDE, lb.SIDE, 3)), "label": ("int64", ())},
}


# -- Mosaic's torchvision stand-in -------------------------------------------------------------
def _stub_torchvision() -> None:
    """Let ``import streaming`` succeed without torchvision (see the module docstring)."""
    try:
        import torchvision  # noqa: F401
        return
    except ImportError:
        pass

    def _absent(*_: Any, **__: Any) -> Any:
        raise RuntimeError("torchvision is not installed in the peers venv")

    tv = types.ModuleType("torchvision")
    datasets = types.ModuleType("torchvision.datasets")
    datasets.VisionDataset = type("VisionDataset", (), {"__init__": _absent})
    datasets.CIFAR10 = datasets.VisionDataset
    transforms = types.ModuleType("torchvision.transforms")
    functional = types.ModuleType("torchvision.transforms.functional")
    functional.to_tensor = _absent
    tv.datasets, tv.transforms, transforms.functional = datasets, transforms, functional
    for mod in (tv, datasets, transforms, functional):  # transformers asks find_spec
        mod.__spec__ = importlib.machinery.ModuleSpec(mod.__name__, None)
        sys.modules[mod.__name__] = mod


# -- conversion (each in its own process) -------------------------------------------------------
def _w1_arrays(parquet: Path) -> Iterator[tuple[np.ndarray, ...]]:
    """W1 row groups as (features, cats, seq, label) NumPy arrays."""
    import pyarrow.parquet as pq

    f = pq.ParquetFile(parquet)
    for g in range(f.num_row_groups):
        t = f.read_row_group(g)
        yield (np.stack([t.column(c).to_numpy() for c in lb.FEATURES], 1),
               np.stack([t.column(c).to_numpy() for c in lb.CATS], 1),
               t.column("seq").combine_chunks().flatten().to_numpy().reshape(t.num_rows, -1),
               t.column("label").to_numpy())


def _w1_samples(parquet: Path) -> Iterator[dict[str, Any]]:
    for feats, cats, seq, label in _w1_arrays(parquet):
        for i in range(len(label)):
            yield {"features": feats[i], "cats": cats[i], "seq": seq[i], "label": int(label[i])}


def _w2_samples(parquet: Path) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    f = pq.ParquetFile(parquet)
    for g in range(f.num_row_groups):
        t = f.read_row_group(g)
        for jpg, label in zip(t.column("jpg").to_pylist(), t.column("label").to_pylist()):
            yield {"jpg": jpg, "label": label}


def _row_groups(args: tuple[str, str]) -> Iterator[dict[str, Any]]:
    """LitData ``optimize`` fn: every sample of one Parquet row group (input = (path, wl:g))."""
    import pyarrow.parquet as pq

    path, spec = args
    wl, g = spec.split(":")
    t = pq.ParquetFile(path).read_row_group(int(g))
    if wl == "w2":
        for jpg, label in zip(t.column("jpg").to_pylist(), t.column("label").to_pylist()):
            yield {"jpg": jpg, "label": label}
        return
    feats = np.stack([t.column(c).to_numpy() for c in lb.FEATURES], 1)
    cats = np.stack([t.column(c).to_numpy() for c in lb.CATS], 1)
    seq = t.column("seq").combine_chunks().flatten().to_numpy().reshape(t.num_rows, -1)
    label = t.column("label").to_numpy()
    for i in range(t.num_rows):
        yield {"features": feats[i], "cats": cats[i], "seq": seq[i], "label": int(label[i])}


def convert(peer: str, wl: str, data: Path, out: Path) -> dict[str, float]:
    """Write workload ``wl``'s Parquet into ``peer``'s format at ``out``; seconds spent."""
    shutil.rmtree(out, ignore_errors=True)
    parquet = data / "data.parquet"
    if peer == "mosaic":
        _stub_torchvision()
        from streaming import MDSWriter

        t = time.perf_counter()
        with MDSWriter(out=str(out), columns=W1_COLUMNS if wl == "w1" else W2_COLUMNS,
                       compression=None) as writer:
            for sample in (_w1_samples if wl == "w1" else _w2_samples)(parquet):
                writer.write(sample)
        return {"seconds": time.perf_counter() - t, "processes": 1}
    if peer == "litdata":
        import pyarrow.parquet as pq
        from litdata import optimize

        groups = pq.ParquetFile(parquet).num_row_groups
        workers = min(os.cpu_count() or 1, groups)
        t = time.perf_counter()
        optimize(fn=_row_groups, inputs=[(str(parquet), f"{wl}:{g}") for g in range(groups)],
                 output_dir=str(out), chunk_bytes="64MB", num_workers=workers, verbose=False)
        return {"seconds": time.perf_counter() - t, "processes": workers}
    if peer == "stoker":
        from stoker.sharder import shard

        t = time.perf_counter()
        shard(str(parquet), str(out), progress=False, overwrite=True)
        return {"seconds": time.perf_counter() - t, "processes": 1}
    raise ValueError(f"unknown peer {peer!r}: expected one of {PEERS + ('stoker',)}")


# -- read cases (each in its own process) -------------------------------------------------------
def _decode(sample: dict[str, Any]) -> dict[str, Any]:
    """JPEG bytes -> HWC uint8 with Pillow, as the torch baseline decodes."""
    from PIL import Image

    return {"jpg": np.asarray(Image.open(io.BytesIO(sample["jpg"])).convert("RGB")),
            "label": sample["label"]}


def _mosaic(out: Path, wl: str, workers: int) -> Iterator[Any]:
    import torch.utils.data
    from streaming import StreamingDataset

    batch = lb.W1_BATCH if wl == "w1" else lb.W2_BATCH

    class Images(StreamingDataset):  # Mosaic's documented way to add a per-sample transform
        def __getitem__(self, idx: int) -> dict[str, Any]:
            return _decode(super().__getitem__(idx))

    cls = StreamingDataset if wl == "w1" else Images
    ds = cls(local=str(out), shuffle=True, shuffle_seed=0, batch_size=batch)
    return iter(torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=workers))


def _litdata(out: Path, wl: str, workers: int) -> Iterator[Any]:
    from litdata import StreamingDataLoader, StreamingDataset

    batch = lb.W1_BATCH if wl == "w1" else lb.W2_BATCH
    ds = StreamingDataset(input_dir=str(out), shuffle=True, seed=0,
                          transform=_decode if wl == "w2" else None)
    return iter(StreamingDataLoader(ds, batch_size=batch, num_workers=workers))


def _make(name: str, data: Path, conv: Path) -> Iterator[Any]:
    wl, who, workers = name.split("/")
    w = int(workers)
    if who == "stoker":
        return lb._stoker_w1(data, w) if wl == "w1" else lb._stoker_w2(data, w)
    if who == "torch+pyarrow":
        return (lb._torch_case(data, w, lb.W1_BATCH, lb._convert_w1) if wl == "w1"
                else lb._torch_case(data, w, lb.W2_BATCH, lb._convert_w2))
    return (_mosaic if who == "mosaic" else _litdata)(conv / f"{who}-{wl}", wl, w)


def _check(wl: str, batch: dict[str, Any], name: str) -> None:
    """The first batch has every expected output with its dtype and shape."""
    rows = len(batch["label"])
    for key, (dtype, shape) in EXPECTED[wl].items():
        v = batch.get(key, batch.get("categoricals") if key == "cats" else None)  # stoker's name
        got = (str(v.dtype).removeprefix("torch."), tuple(v.shape)) if v is not None else None
        if got != (dtype, (rows, *shape)):
            raise RuntimeError(f"case {name}: output {key!r} is {got}, expected "
                               f"{(dtype, (rows, *shape))}")


def run_case(name: str, data: Path, conv: Path) -> dict[str, float]:
    """One epoch of case ``name`` in this process, timed from the loader's construction."""
    import pyarrow.parquet  # noqa: F401
    import torch.utils.data  # noqa: F401
    from PIL import Image  # noqa: F401

    import stoker.loader.dataloader  # noqa: F401
    warnings.filterwarnings("ignore", "The given NumPy array is not writable")  # zero-copy views
    who = name.split("/")[1]
    if who == "mosaic":
        _stub_torchvision()
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
    elif who == "litdata":
        import litdata  # noqa: F401
    t0 = time.perf_counter()
    it = _make(name, data, conv)
    first = next(it)
    t1 = time.perf_counter()
    _check(name.split("/")[0], first, name)
    n = len(first["label"])
    for b in it:
        n += len(b["label"])
    t2 = time.perf_counter()
    return {"samples": n, "seconds": t2 - t0, "samples_per_s": n / (t2 - t0),
            "first_batch_s": t1 - t0}


# -- driver ------------------------------------------------------------------------------------
def _child(args: list[str], records: Path, name: str) -> dict[str, float]:
    cmd = [sys.executable, str(Path(__file__).resolve()), *args]
    cache = records.parent / "litdata-cache"  # LitData's scratch and cache, not /tmp/chunks
    env = {**os.environ, "STOKER_ROW_MAJOR_DIR": str(records), "LITDATA_CACHE_DIR": str(cache),
           "DATA_OPTIMIZER_CACHE_FOLDER": str(cache / "chunks"),
           "DATA_OPTIMIZER_DATA_CACHE_FOLDER": str(cache / "data")}
    return lb._watch(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env), name)


def _versions() -> str:
    from importlib.metadata import version

    return ", ".join(f"{p} {version(p)}" for p in
                     ("torch", "numpy", "pyarrow", "mosaicml-streaming", "litdata", "stoker"))


def build_table(results: dict[str, dict[str, float]]) -> str:
    rows = ["| workload | loader | workers | samples | samples/s | stoker / this | first batch "
            "| peak RSS (tree): all / private |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        wl, who, workers = name.split("/")
        mine = results.get(f"{wl}/stoker/{workers}", {}).get("samples_per_s")
        ratio = "-" if who == "stoker" or mine is None else f"{mine / r['samples_per_s']:.1f}x"
        rows.append(f"| {wl.upper()} | {who} | {workers} | {r['samples']:,.0f} "
                    f"| {r['samples_per_s']:,.0f} | {ratio} | {r['first_batch_s']:.2f} s "
                    f"| {r['peak_rss_mb']:,.0f} / {r['peak_private_mb']:,.0f} MiB |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--images", type=int, default=5_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=WORKDIR)
    ap.add_argument("--only", default="", help="run only cases whose name contains this")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--convert", help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.convert:
        peer, wl = args.convert.split("/")
        print(json.dumps(convert(peer, wl, args.data, args.out)))
        return 0
    if args.case:
        print(json.dumps(run_case(args.case, args.data, args.out)))
        return 0

    lb.prepare(args.workdir, args.rows, args.images)
    data = {"w1": args.workdir / f"w1-{args.rows}", "w2": args.workdir / f"w2-{args.images}"}
    sizes = {"w1": args.rows, "w2": args.images}
    conv = args.workdir / f"converted-{args.rows}-{args.images}"
    records = args.workdir / "row-major"
    conversions = {}
    for peer in ("stoker",) + PEERS:
        for wl in ("w1", "w2"):
            r = _child(["--convert", f"{peer}/{wl}", "--data", str(data[wl]),
                        "--out", str(conv / f"{peer}-{wl}")], records, f"convert {peer}/{wl}")
            r["s_per_million"] = r["seconds"] * 1e6 / sizes[wl]
            conversions[f"{wl}/{peer}"] = r
    names = [f"{wl}/{who}/{w}" for wl in ("w1", "w2") for w in (0, 2)
             for who in ("stoker", "torch+pyarrow") + PEERS]
    names = [n for n in names if args.only in n]
    _child(["--case", "w1/stoker/0", "--data", str(data["w1"]), "--out", str(conv)], records,
           "warm-up")  # untimed: leaves W1's row-major records on disk, as loader_bench does
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for _ in range(args.repeats):  # interleaved, so load changes hit every case alike
        for name in names:
            runs[name].append(_child(["--case", name, "--data", str(data[name.split("/")[0]]),
                                      "--out", str(conv)], records, name))
    results = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in runs.items()}
    load = os.getloadavg()
    print(f"`nice -n 19 /work/peers-venv/bin/python bench/peers_bench.py --rows {args.rows} "
          f"--images {args.images} --repeats {args.repeats}` — {platform.machine()}, "
          f"{os.cpu_count()} shared cores, load average {load[0]:.1f}/{load[1]:.1f} at the end, "
          f"Python {platform.python_version()}, {_versions()}. Medians of {args.repeats} runs, "
          f"each case in a fresh process.\n")
    print(build_table(results))
    print("\nConversion (once, fresh process, from the Parquet file; s per 1 M samples): "
          + "; ".join(f"{k} {r['seconds']:.1f} s = {r['s_per_million']:.0f} s/M "
                      f"({r['processes']:.0f} proc, peak RSS {r['peak_rss_mb']:,.0f} MiB)"
                      for k, r in conversions.items()))
    print("\n" + json.dumps({"results": results, "conversions": conversions}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
