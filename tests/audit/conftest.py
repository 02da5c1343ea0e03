"""Fixtures for ledger and audit tests: a small real dataset and ledgers written as a loader would.

Ledgers are produced by driving ``LedgerWriter`` with the ids the order contract gives
(``EpochOrder`` + ``rank_batch_ids``), so the tests do not depend on the DataLoader; a
``mutate(epoch, step, rank, ids) -> ids`` hook injects faults.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from stoker.loader.ledger.writer import LedgerWriter
from stoker.loader.order.epoch import EpochOrder, OrderOptions
from stoker.loader.order.schedule import BatchPlan, rank_batch_ids
from stoker.manifest import Manifest, ShardInfo, hash_file

ROWS = (30, 25, 40, 17)
SCHEMA = pa.schema([("x", pa.float32()), ("label", pa.int64())])
Mutate = Callable[[int, int, int, np.ndarray], np.ndarray]


def make_dataset(root: Path, rows: tuple[int, ...] = ROWS, offset: float = 0.0) -> Manifest:
    """Write Arrow IPC shards of ``rows`` samples each and their manifest under ``root``."""
    (root / "shards").mkdir(parents=True, exist_ok=True)
    shards, start = [], 0
    for i, n in enumerate(rows):
        rel = f"shards/{i:05d}.arrow"
        table = pa.table({"x": pa.array(np.arange(start, start + n, dtype=np.float32) + offset),
                          "label": pa.array(np.arange(start, start + n) % 3)}, schema=SCHEMA)
        with pa.OSFile(str(root / rel), "wb") as f, pa.ipc.new_file(f, SCHEMA) as w:
            w.write_table(table)
        digest, size = hash_file(root / rel)
        shards.append(ShardInfo(rel, n, size, digest, (n,)))
        start += n
    m = Manifest.create(schema=SCHEMA, shards=shards, sources=[], options={"test": True},
                        stoker_version="0.1.0")
    m.save(root)
    return Manifest.load(root)


def header(m: Manifest, dataset: str, *, seed: int = 7, global_batch: int = 8,
           world_size: int = 1, rank: int = 0, start_epoch: int = 0,
           order: OrderOptions | None = None, drop_last: bool = False) -> dict[str, Any]:
    return {"dataset": dataset, "fingerprint": m.fingerprint, "num_samples": m.num_samples,
            "seed": seed, "order": (order or OrderOptions(partitions=4)).to_dict(),
            "global_batch": global_batch, "world_size": world_size, "rank": rank,
            "drop_last": drop_last, "num_workers": 2, "worker_mode": "thread",
            "start_epoch": start_epoch, "kind": "stoker", "mode": "order"}


def expected_ids(m: Manifest, head: dict[str, Any], epoch: int, step: int, rank: int) -> np.ndarray:
    order = EpochOrder(m.shard_rows, head["fingerprint"], head["seed"], epoch,
                       OrderOptions.from_dict(head["order"]))
    plan = BatchPlan(head["num_samples"], head["global_batch"], head["world_size"], rank,
                     head["drop_last"])
    return rank_batch_ids(order, plan, step)


def steps_per_epoch(head: dict[str, Any]) -> int:
    return BatchPlan(head["num_samples"], head["global_batch"], head["world_size"], 0,
                     head["drop_last"]).steps_per_epoch


def write_steps(w: LedgerWriter, m: Manifest, head: dict[str, Any],
                positions: list[tuple[int, int]], mutate: Mutate | None = None) -> None:
    """Record ``positions`` [(epoch, step)] for the writer's rank, as a loader would."""
    rank = head["rank"]
    for i, (epoch, step) in enumerate(positions):
        ids = expected_ids(m, head, epoch, step, rank)
        if mutate is not None:
            ids = mutate(epoch, step, rank, ids.copy())
        w.step(epoch, step, rank, ids, 0.001 * (i % 3), 0.01)


def epoch_positions(head: dict[str, Any], epochs: range) -> list[tuple[int, int]]:
    return [(e, s) for e in epochs for s in range(steps_per_epoch(head))]


@pytest.fixture()
def dataset(tmp_path: Path) -> tuple[Manifest, str]:
    root = tmp_path / "data"
    return make_dataset(root), str(root)


def write_run(path: Path, m: Manifest, location: str, *, epochs: int = 2, ids: bool = False,
              mutate: Mutate | None = None, world_size: int = 1, **kw: Any) -> Path:
    """A clean (or mutated) run of ``epochs`` full epochs, one ledger per rank."""
    for rank in range(world_size):
        head = header(m, location, world_size=world_size, rank=rank, **kw)
        with LedgerWriter(path, head, ids=ids) as w:
            write_steps(w, m, head, epoch_positions(head, range(epochs)), mutate)
    return path


@pytest.fixture()
def kit() -> SimpleNamespace:
    """The helpers above, for test modules (importlib mode cannot import conftest by name)."""
    return SimpleNamespace(make_dataset=make_dataset, header=header, expected_ids=expected_ids,
                           steps_per_epoch=steps_per_epoch, write_steps=write_steps,
                           epoch_positions=epoch_positions, write_run=write_run)
