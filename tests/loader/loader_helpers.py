"""Shared helpers for loader tests: run loaders and rebuild global batches from ranks."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from shard_writer import write_dataset  # noqa: E402

from stoker.loader import DataLoader  # noqa: E402
from stoker.manifest import Manifest  # noqa: E402


def ids_of(batches: Iterable[Any]) -> list[list[int]]:
    return [b["id"].tolist() for b in batches]


def global_batches(path: Any, world_size: int, global_batch: int, epoch: int = 0,
                   **kw: Any) -> list[list[int]]:
    """Run every rank for one epoch in lockstep and interleave their batches back into global
    batches: position k of a global batch belongs to rank k % world_size."""
    per_rank = []
    for rank in range(world_size):
        dl = DataLoader(path, batch_size=global_batch // world_size, rank=rank,
                        world_size=world_size, **kw)
        dl.set_epoch(epoch)
        per_rank.append(ids_of(dl))
        dl.close()
    steps = {len(r) for r in per_rank}
    assert len(steps) == 1, f"ranks took different step counts: {steps}"
    out = []
    for step in range(steps.pop()):
        parts = [list(per_rank[r][step]) for r in range(world_size)]
        merged = []
        k = step * global_batch
        while any(parts):
            r = k % world_size
            if not parts[r]:
                break
            merged.append(parts[r].pop(0))
            k += 1
        assert not any(parts), "rank shares do not interleave as k % world_size"
        out.append(merged)
    return out


def run_with_resume(make: Any, stops: list[int], epochs: int) -> list[int]:
    """Consume ``epochs`` epochs, saving state at each global batch index in ``stops`` and
    continuing in a brand-new loader made by ``make(i)`` (i = number of resumes so far)."""
    consumed: list[int] = []
    total_seen = 0
    resumes = 0
    state = None
    stops = sorted(stops)
    while True:
        dl = make(resumes)
        if state is not None:
            dl.load_state_dict(state)
        broke = False
        while dl.epoch < epochs:
            it = iter(dl)
            for batch in it:
                consumed.extend(batch["id"].tolist())
                total_seen += 1
                if stops and total_seen == stops[0]:
                    stops.pop(0)
                    state = dl.state_dict()
                    broke = True
                    break
            if broke:
                break
        dl.close()
        if not broke:
            return consumed
        resumes += 1


def make_dataset(root: Path, shard_rows: list[int], compression: str = "none",
                 batch_rows: int = 16) -> Manifest:
    """A dataset whose column ``id`` equals the global sample id (so order is observable)."""
    starts = np.concatenate([[0], np.cumsum(shard_rows)]).astype(np.int64)
    tables = []
    for s in range(len(shard_rows)):
        ids = np.arange(starts[s], starts[s + 1], dtype=np.int64)
        tables.append(pa.table({
            "id": ids,
            "x": (ids * 0.5).astype(np.float32),
            "y": (ids % 7).astype(np.int32),
            "seq": pa.array([[float(i)] * int(i % 3) for i in ids], pa.list_(pa.float32())),
            "name": [f"s{i}" for i in ids],
        }))
    return write_dataset(root, tables, compression, batch_rows)
