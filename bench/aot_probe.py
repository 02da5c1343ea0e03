"""Kernels compiled ahead of time (stoker.loader.jit.aot, ``numba.pycc``): what a process saves.

A fresh process pays ~0.5 s of Numba before its first kernel runs (importing Numba and making
the dispatchers ~0.2 s, the typing context of the first cached kernel ~0.25 s; on 2 cores, a
2 M-row W1 epoch read from stored records takes ~0.3 s past its first batch). A kernel
compiled ahead of time into a plain extension module needs no Numba at run time. This probe
builds the node's module (stoker.loader.jit.aot: the order's kernel and the row-major records
gather, ``stoker.loader.fastpath.record_table._gather``, raw pointers and prefetches through
stoker's intrinsics, a binary search from another kernel) into a temporary directory, then,
each in a fresh process:

- ``aot``: loads the module and runs the gather once (Numba must stay unimported);
- ``jit``: makes stoker's kernels and runs the cached JIT gather once (its cost at start-up);

and compares the two on the same W1-sized records: bytes written (must be equal) and time
per 1,024-row batch (median of ``--repeats`` runs of 300 batches each).

Run (the command behind bench/RESULTS.md, "Cold start"):

    .venv/bin/python bench/aot_probe.py

``numba.pycc`` is pending deprecation in Numba (since 0.57) with a replacement announced.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

STRIDE, ROWS = 392, [600_000, 600_000, 600_000, 200_000]  # W1's record, 2 M rows in 4 shards
FIELDS = ([0, 256, 320, 384], [256, 64, 64, 8])  # features, categoricals, seq, label bytes


def build(out: str) -> float:
    """Build the node's module (stoker.loader.jit.aot.build) into ``out``; seconds taken."""
    from stoker.loader.jit import aot

    t = time.perf_counter()
    aot.build(out)
    return time.perf_counter() - t


def _inputs(seed: int) -> tuple[Any, ...]:
    from stoker.loader.jit.search import bucket_index

    rng = np.random.default_rng(seed)
    records = [rng.integers(0, 255, (r, STRIDE), dtype=np.uint8) for r in ROWS]
    starts = np.concatenate([[0], np.cumsum(ROWS)]).astype(np.int64)
    shift, bucket = bucket_index(starts)
    addrs = np.array([r.ctypes.data for r in records], dtype=np.int64)
    return records, starts, shift, bucket, addrs


def _call(fn: Any, inputs: tuple[Any, ...], ids: np.ndarray) -> list[np.ndarray]:
    _, starts, shift, bucket, addrs = inputs
    offsets, sizes = (np.array(v, dtype=np.int64) for v in FIELDS)
    outs = [np.empty((len(ids), s), dtype=np.uint8) for s in FIELDS[1]]
    out_addrs = np.array([o.ctypes.data for o in outs], dtype=np.int64)
    out_strides = np.array([o.strides[0] for o in outs], dtype=np.int64)
    n = len(ids)
    fn(ids, starts, shift, bucket, addrs, STRIDE, offsets, sizes, out_addrs, out_strides,
       np.empty(n, dtype=np.int64), np.zeros(len(ROWS), dtype=np.int64), 1,
       np.empty(n, dtype=np.int64))
    return outs


def child(kind: str, out: str, repeats: int) -> dict[str, Any]:
    """One fresh process: the kernel's start-up cost, its bytes' digest, its time per batch."""
    inputs = _inputs(0)
    ids = np.random.default_rng(1).permutation(sum(ROWS))[:1024].astype(np.int64)
    t = time.perf_counter()
    if kind == "aot":
        os.environ.update(STOKER_AOT="on", STOKER_AOT_DIR=out)
        from stoker.loader.jit import aot

        fn = aot.function("record_gather")
    else:
        from stoker.loader.fastpath import record_table
        from stoker.loader.jit.kernel import materialize

        materialize()
        fn = record_table._gather
    first = _call(fn, inputs, ids)
    start_s = time.perf_counter() - t
    batches = [np.random.default_rng(2 + i).integers(0, sum(ROWS), 1024) for i in range(300)]
    per = []
    for _ in range(repeats):
        t = time.perf_counter()
        for b in batches:
            _call(fn, inputs, b)
        per.append((time.perf_counter() - t) / len(batches))
    return {"start_s": start_s, "us_per_batch": float(np.median(per)) * 1e6,
            "numba_imported": "numba" in sys.modules,
            "bytes": [hashlib.sha256(o.tobytes()).hexdigest() for o in first]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--child", default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.out, args.repeats)))
        return
    with tempfile.TemporaryDirectory() as out:
        seconds = build(out)
        runs = {}
        for kind in ("jit", "aot"):  # a fresh process each: start-up is what is measured
            done = subprocess.run([sys.executable, __file__, "--child", kind, "--out", out,
                                   "--repeats", str(args.repeats)], check=True,
                                  capture_output=True, text=True)
            runs[kind] = json.loads(done.stdout.strip().splitlines()[-1])
    aot, jit = runs["aot"], runs["jit"]
    if aot["bytes"] != jit["bytes"]:
        raise SystemExit("the ahead-of-time gather wrote other bytes than the JIT kernel")
    if aot["numba_imported"]:
        raise SystemExit("importing the ahead-of-time module imported Numba")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}; the module built in {seconds:.1f} s (once per node)")
    print("| kernel | start-up to first batch | us per 1,024-row W1 batch | Numba imported |")
    print("|---|---:|---:|---|")
    for kind in ("jit", "aot"):
        r = runs[kind]
        print(f"| {kind} | {r['start_s'] * 1e3:.0f} ms | {r['us_per_batch']:.1f} | "
              f"{r['numba_imported']} |")
    print(f"start-up saved: {(jit['start_s'] - aot['start_s']) * 1e3:.0f} ms; per batch aot / "
          f"jit {aot['us_per_batch'] / jit['us_per_batch']:.2f}x; same bytes")


if __name__ == "__main__":
    main()
