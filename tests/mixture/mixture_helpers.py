"""Small mixture datasets and an independent model of a mixture's stream.

Every source has the same columns: ``id`` (the sample's id within its source, so order is
observable), ``x`` (float32), ``seq`` (list<float32> of id % 3 values) and ``name``. The model
follows the docstrings of ``stoker.loader.order.mixture`` and ``stoker.loader.order.mixture_order``: the
blend's (source, pick) per global position, then ``EpochOrder`` of that source for the pick's
pass (``pick div N_i``) at ``pick mod N_i``, under that source's share of the partitions.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa

from shard_writer import write_dataset
from stoker.loader.order.mixture import Mixture
from stoker.loader.order.epoch import EpochOrder, OrderOptions
from stoker.manifest import Manifest


def make_source(root: Path, shard_rows: list[int], x_type: pa.DataType = pa.float32(),
                salt: int = 0, nullable: bool = True) -> Manifest:
    """A dataset of ``sum(shard_rows)`` samples, one shard per entry (``nullable=False``: the
    same values under a schema whose ``x`` is not nullable, which no other source shares)."""
    starts = np.concatenate([[0], np.cumsum(shard_rows)]).astype(np.int64)
    tables = []
    for s in range(len(shard_rows)):
        ids = np.arange(starts[s], starts[s + 1], dtype=np.int64)
        table = pa.table({
            "id": ids,
            "x": pa.array((ids * 0.5 + salt).astype(np.float64), x_type),
            "seq": pa.array([[float(i)] * int(i % 3) for i in ids], pa.list_(pa.float32())),
            "name": [f"s{salt}-{i}" for i in ids],
        })
        if not nullable:
            table = table.cast(table.schema.set(1, pa.field("x", x_type, nullable=False)))
        tables.append(table)
    return write_dataset(root, tables, "none", 8)


def pairs(batches: Iterable[Any]) -> list[tuple[int, int]]:
    """(source, id) of every sample of ``batches``, in order."""
    return [(int(s), int(i)) for b in batches
            for s, i in zip(b["source"].tolist(), b["id"].tolist())]


def pairs_until(dl: Any, stop: int) -> tuple[list[tuple[int, int]], dict]:
    """(source, id) of ``dl``'s first ``stop`` batches (across epochs), and the JSON-plain
    state after them; ``dl`` is closed."""
    got: list[tuple[int, int]] = []
    done = 0
    while done < stop:
        for b in dl:
            got += pairs([b])
            done += 1
            if done == stop:
                break
    state = json.loads(json.dumps(dl.state_dict()))
    dl.close()
    return got, state


def expected(mixture: Mixture, seed: int, start: int, stop: int,
             options: OrderOptions) -> list[tuple[int, int]]:
    """(source, id) of global stream positions ``[start, stop)`` by the written rule."""
    src, pick = mixture.blend.picks(start, stop)
    out = []
    orders: dict[tuple[int, int], EpochOrder] = {}
    total, P = sum(mixture.sizes), options.partitions
    for i, j in zip(src.tolist(), pick.tolist()):
        m, n = mixture.manifests[i], mixture.sizes[i]
        key = (i, j // n)
        if key not in orders:  # source i's share of the partitions: P * n / total, halves up
            share = max(1, math.floor(Fraction(P * n, total) + Fraction(1, 2)))
            own = OrderOptions(options.shuffle, share if options.shuffle else P,
                               options.block_size, options.partition_mode)
            orders[key] = EpochOrder(m.shard_rows, m.fingerprint, seed, j // n, own)
        out.append((i, int(orders[key].ids_at(np.array([j % n]))[0])))
    return out
