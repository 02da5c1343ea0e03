"""Ledger cost: bytes per step on disk and writer time per step, against a JSON-lines baseline.

The baseline is what one would write by hand: one JSON object per step (same fields, ids as a
hex digest) appended to a text file, flushed the same way, optionally zstd-compressed as a
whole at the end (which is not crash-safe: a killed writer leaves an unreadable file).
Also times ``stoker audit`` (read + replay + coverage) per step.

Run: ``python bench/bench_ledger.py [--steps N] [--batch B] [--repeats R]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import xxhash
import zstandard

from stoker.loader.ledger.writer import LedgerWriter

HEADER = {"dataset": "/data/x", "fingerprint": "f" * 32, "seed": 1, "rank": 0, "world_size": 1,
          "global_batch": 256, "num_samples": 10**9}


def _timings(steps: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Realistic jitter: waits mostly ~0.1 ms with rare stalls, ~20 ms between batches."""
    rng = np.random.default_rng(seed)
    wait = rng.exponential(1e-4, steps) + (rng.random(steps) < 0.02) * rng.exponential(5e-3, steps)
    between = 0.02 + rng.normal(0, 5e-4, steps) + wait
    return wait.astype(np.float32), between.astype(np.float32)


def stoker_ledger(path: Path, batches: list[np.ndarray], wait: np.ndarray, between: np.ndarray,
                  ids: bool = False) -> float:
    t0 = time.perf_counter()
    with LedgerWriter(path, HEADER, ids=ids) as w:
        for s, b in enumerate(batches):
            w.step(0, s, 0, b, float(wait[s]), float(between[s]))
    return time.perf_counter() - t0


def jsonl_ledger(path: Path, batches: list[np.ndarray], wait: np.ndarray,
                 between: np.ndarray) -> float:
    t0 = time.perf_counter()
    with open(path, "w") as f:
        f.write(json.dumps(HEADER) + "\n")
        for s, b in enumerate(batches):
            digest = xxhash.xxh3_64_hexdigest(np.ascontiguousarray(b, dtype="<i8").tobytes())
            f.write(json.dumps({"epoch": 0, "step": s, "rank": 0, "count": len(b), "digest": digest,
                                "wait_s": float(wait[s]), "between_s": float(between[s])}) + "\n")
            if s % 1024 == 1023:
                f.flush()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    n, b = args.steps, args.batch
    # shuffled ids, as a real epoch order gives them (ids compress far better when sorted)
    batches = list(np.random.default_rng(1).permutation(n * b).astype(np.int64).reshape(n, b))
    wait, between = _timings(n)
    tmp = Path(tempfile.mkdtemp(prefix="stoker-bench-ledger-"))
    times: dict[str, list[float]] = {"stoker": [], "stoker+ids": [], "jsonl": []}
    for _ in range(args.repeats):
        for f in tmp.glob("*"):
            f.unlink()
        times["stoker"].append(stoker_ledger(tmp / "a.ledger", batches, wait, between))
        times["stoker+ids"].append(stoker_ledger(tmp / "i.ledger", batches, wait, between, True))
        times["jsonl"].append(jsonl_ledger(tmp / "a.jsonl", batches, wait, between))
    raw = (tmp / "a.jsonl").read_bytes()
    sizes = {"stoker": (tmp / "a.ledger").stat().st_size,
             "stoker+ids": (tmp / "i.ledger").stat().st_size,
             "jsonl": len(raw),
             "jsonl.zst (whole file, not crash-safe)":
                 len(zstandard.ZstdCompressor(level=3).compress(raw))}
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
          f"python {platform.python_version()}; steps={n} batch={b} repeats={args.repeats}")
    print(f"{'ledger':<40} {'bytes/step':>10} {'writer us/step (median)':>24}")
    for name, size in sizes.items():
        key = name.split(" ")[0].removesuffix(".zst")
        med = statistics.median(times[key]) / n * 1e6
        print(f"{name:<40} {size / n:>10.2f} {med:>24.2f}")
    ratio = statistics.median(times["jsonl"]) / statistics.median(times["stoker"])
    print(f"writer speed stoker vs jsonl: {ratio:.2f}x; size jsonl/stoker: "
          f"{sizes['jsonl'] / sizes['stoker']:.1f}x")
    audit_time(tmp, n)


def audit_time(tmp: Path, n: int) -> None:
    """Read + replay + coverage of a clean run over a real manifest, per step."""
    import pyarrow as pa

    from stoker.loader.order.epoch import EpochOrder, OrderOptions
    from stoker.loader.order.schedule import BatchPlan, rank_batch_ids
    from stoker.manifest import Manifest, ShardInfo
    from stoker.tools.audit import audit

    rows = 2000
    shards = [ShardInfo(f"s/{i:05d}.arrow", rows, 1, "0" * 32, (rows,)) for i in range(500)]
    m = Manifest.create(schema=pa.schema([("x", pa.int64())]), shards=shards, sources=[],
                        options={}, stoker_version="0")
    (tmp / "data").mkdir()
    m.save(tmp / "data")
    head = {**HEADER, "dataset": str(tmp / "data"), "fingerprint": m.fingerprint,
            "num_samples": m.num_samples, "global_batch": 10, "order": OrderOptions().to_dict(),
            "kind": "stoker", "mode": "order", "drop_last": False}
    plan = BatchPlan(m.num_samples, 10)
    order = EpochOrder(m.shard_rows, m.fingerprint, 1, 0, OrderOptions())
    steps = min(n, plan.steps_per_epoch)
    with LedgerWriter(tmp / "r.ledger", head) as w:
        for s in range(steps):
            w.step(0, s, 0, rank_batch_ids(order, plan, s), 1e-4, 0.02)
    t0 = time.perf_counter()
    report = audit(tmp / "r.ledger", verify=False)
    dt = time.perf_counter() - t0
    print(f"audit (read + replay + coverage, {steps} steps): {dt:.2f} s, "
          f"{dt / steps * 1e6:.1f} us/step, reproducible={report.reproducible}")


if __name__ == "__main__":
    main()
