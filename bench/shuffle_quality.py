"""Shuffle quality of the stoker order against a true random permutation, on label-sorted data.

Run: ``.venv/bin/python bench/shuffle_quality.py [--samples 1000000] [--shards 1000]``

The worst case for a locality-preserving shuffle is a dataset written sorted by label (class
folders, time-sorted logs): every shard then holds one or two classes. For each order we cut the
epoch into global batches of ``--batch`` samples and report, averaged over batches:
- distinct labels per batch (of ``--classes``), and per-batch label entropy in bits;
- total-variation distance between a batch's label histogram and the dataset's;
and, over the whole epoch, Spearman's rank correlation between position and sample id (0 when
no trace of the sorted input is left). The baseline is ``np.random.default_rng(seed).permutation``;
the figure of merit is each metric as a fraction of the baseline's.
"""

from __future__ import annotations

import argparse
import time
from typing import Sequence

import numpy as np


def _batch_metrics(order: np.ndarray, labels: np.ndarray, batch: int,
                   classes: int) -> dict[str, float]:
    nb = len(order) // batch
    lab = labels[order[: nb * batch]].reshape(nb, batch)
    counts = np.bincount((np.arange(nb)[:, None] * classes + lab).ravel(),
                         minlength=nb * classes).reshape(nb, classes)
    p = counts / batch
    with np.errstate(divide="ignore", invalid="ignore"):
        entropy = -np.where(p > 0, p * np.log2(p), 0.0).sum(axis=1)
    overall = np.bincount(labels, minlength=classes) / len(labels)
    tv = 0.5 * np.abs(p - overall).sum(axis=1)
    pos = np.arange(len(order), dtype=np.float64)
    rank_of_id = order.astype(np.float64)  # ids are 0..N-1, already ranks
    spearman = float(np.corrcoef(pos, rank_of_id)[0, 1])
    return {"distinct": float((counts > 0).sum(axis=1).mean()), "entropy": float(entropy.mean()),
            "tv": float(tv.mean()), "spearman": spearman}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from stoker.loader.order.epoch import EpochOrder, OrderOptions

    n, shards, classes, batch = args.samples, args.shards, args.classes, args.batch
    rows = np.full(shards, n // shards, dtype=np.int64)
    rows[: n % shards] += 1
    labels = (np.arange(n, dtype=np.int64) * classes) // n  # sorted by label
    shard = int(np.median(rows))
    print(f"N={n:,} label-sorted samples, {shards} shards of ~{shard}, {classes} classes "
          f"({n // classes:,} samples = {n / classes / shard:.1f} shards per class), "
          f"global batch {batch}")
    settings: list[tuple[str, OrderOptions | None]] = [
        ("true random permutation [baseline]", None),
        ("shards permuted only (P=1, K=1)", OrderOptions(partitions=1, block_size=1)),
        ("P=1, K=1 shard", OrderOptions(partitions=1, block_size=shard)),
        ("P=1, K=auto (4 shards)", OrderOptions(partitions=1)),
        ("P=8, K=auto (4 shards) [first default]", OrderOptions(partitions=8)),
        ("P=32, K=auto (4 shards) [default until issue 12]", OrderOptions(partitions=32)),
        ("P=12, K=1024 [default: indexed Parquet, 20 M rows]",
         OrderOptions(partitions=12, block_size=1024)),
        ("P=24, K=1024", OrderOptions(partitions=24, block_size=1024)),
        ("P=120, K=1024", OrderOptions(partitions=120, block_size=1024)),
        ("P=240, K=1024 [default: batch 256]", OrderOptions(partitions=240, block_size=1024)),
        ("P=720, K=1024 [default: batch >= 720]", OrderOptions(partitions=720, block_size=1024)),
        ("P=8, K=auto, fixed partitions", OrderOptions(partitions=8, partition_mode="fixed")),
        ("P=8, K=16 shards", OrderOptions(partitions=8, block_size=16 * shard)),
        ("P=64, K=auto (4 shards)", OrderOptions(partitions=64)),
        ("P=64, K=16 shards", OrderOptions(partitions=64, block_size=16 * shard)),
        ("P=8, K=N (full shuffle per partition)", OrderOptions(partitions=8, block_size=n)),
    ]
    base: dict[str, float] = {}
    header = (f"{'order':40s} {'distinct/batch':>15s} {'entropy bits':>13s} {'TV to data':>11s} "
              f"{'spearman':>9s} {'distinct vs base':>17s} {'entropy vs base':>16s}")
    print(header)
    for name, opts in settings:
        t = time.perf_counter()
        if opts is None:
            order = np.random.default_rng(args.seed).permutation(n)
        else:
            order = EpochOrder(rows, "quality", args.seed, 0, opts).ids(0, n)
        elapsed = time.perf_counter() - t
        m = _batch_metrics(order, labels, batch, classes)
        base = base or m
        print(f"{name:40s} {m['distinct']:15.2f} {m['entropy']:13.3f} {m['tv']:11.3f} "
              f"{m['spearman']:9.4f} {m['distinct'] / base['distinct']:17.3f} "
              f"{m['entropy'] / base['entropy']:16.3f}   ({elapsed:.2f} s)")
    ideal = classes * (1 - (1 - 1 / classes) ** batch)
    print(f"expected distinct labels per batch for an ideal shuffle: {ideal:.2f}; "
          f"entropy ceiling log2({classes}) = {np.log2(classes):.3f} bits")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
