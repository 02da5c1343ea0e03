"""A naive, loop-based model of the order algorithm, shared by the order tests.

The model follows the module docstring of ``stoker.loader.order.epoch`` step by step with Python
lists and the pure-Python Feistel reference, so agreement with ``EpochOrder`` checks the
vectorised piece table and the Numba kernels against the written algorithm.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from stoker.loader.order.feistel import feistel_py, hash_keys_py, mix64_py
from stoker.loader.order.epoch import OrderOptions, derive_seed

GOLDEN = 0x9E3779B97F4A7C15
SALT_SHARDS, SALT_BLOCKS, SALT_PIECES = 1, 2, 3


def naive_order(rows: list[int], fp: str, seed: int, epoch: int, opts: OrderOptions) -> list[int]:
    """O[0..N) computed the slow, obvious way."""
    opts = opts.resolve(np.asarray(rows, dtype=np.int64))
    n = sum(rows)
    if not opts.shuffle:
        return list(range(n))
    P, K = opts.partitions, opts.block_size
    fixed = opts.partition_mode == "fixed"
    starts = [sum(rows[:i]) for i in range(len(rows))]
    keys = hash_keys_py(derive_seed(fp, seed, -1 if fixed else epoch, SALT_SHARDS), len(rows))
    perm = sorted(range(len(rows)), key=lambda i: (keys[i], i))
    stream = [(s, starts[s] + r) for s in perm for r in range(rows[s])]  # (shard, global id)
    q, rem = divmod(n, P)
    parts = []
    for p in range(P):
        b = p * q + min(p, rem)
        parts.append(stream[b:b + q + (p < rem)])
    if fixed:
        runs = []  # maximal runs of one shard inside one partition, in stream order
        for p, part in enumerate(parts):
            for item in part:
                if runs and runs[-1][0] == p and runs[-1][1][-1][0] == item[0]:
                    runs[-1][1].append(item)
                else:
                    runs.append((p, [item]))
        pkeys = hash_keys_py(derive_seed(fp, seed, epoch, SALT_PIECES), len(runs))
        for p in range(P):
            mine = sorted((pkeys[i], i) for i, (rp, _) in enumerate(runs) if rp == p)
            parts[p] = [item for _, i in mine for item in runs[i][1]]
    bkeys = hash_keys_py(derive_seed(fp, seed, epoch, SALT_BLOCKS), P)
    out = []
    for k in range(n):
        p, j = k % P, k // P
        b, o = divmod(j, K)
        blen = min(K, len(parts[p]) - b * K)
        key = mix64_py(bkeys[p] + (b + 1) * GOLDEN)
        out.append(parts[p][b * K + feistel_py(o, blen, key)][1])
    return out


shard_rows = st.lists(st.integers(0, 30), min_size=0, max_size=12)
options = st.builds(OrderOptions, shuffle=st.just(True), partitions=st.integers(1, 8),
                    block_size=st.integers(0, 9),
                    partition_mode=st.sampled_from(["redraw", "fixed"]))
