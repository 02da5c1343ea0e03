"""What the framework scripts train on, and how their runs are checked (shared helpers)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

N, BATCH, EPOCHS = 64, 8, 2


class Numbers(torch.utils.data.Dataset):
    """Sample i is ({"i": i, "x": [i, 1]}, so a batch names its samples."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict:
        return {"i": i, "x": torch.tensor([float(i) / N, 1.0])}


def finish() -> None:
    """End a training script: leave the process group together, then exit without C++
    teardown. gloo's threads abort the interpreter at exit when the group is left alive
    ("terminate called without an active exception", pytorch/pytorch#190489), and CI saw it
    again on 2026-12-02 with ``destroy_process_group()`` called (rank 1 aborted at exit while
    rank 0 was still leaving). What the test checks is already written by :func:`record`."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def record(out: Path, rank: int, world: int, epochs: list[list[int]], **extra: Any) -> None:
    """Write what this rank consumed, one list of sample ids per epoch."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(
        {"rank": rank, "world": world, "epochs": epochs, **extra}))


def check(out: Path, world: int) -> list[dict]:
    """Every rank ran, the ranks took the same number of steps, and in every epoch their
    samples are disjoint and together the whole dataset (no DistributedSampler duplicates)."""
    runs = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    assert [r["world"] for r in runs] == [world] * world
    for epoch in range(EPOCHS):
        seen = [r["epochs"][epoch] for r in runs]
        assert len({len(s) for s in seen}) == 1, "ranks took different step counts"
        flat = [i for s in seen for i in s]
        assert sorted(flat) == list(range(N)), f"epoch {epoch}: not one pass over the data"
    first = [i for r in runs for i in r["epochs"][0]]
    second = [i for r in runs for i in r["epochs"][1]]
    assert first != second, "set_epoch did not reach the loader (same order twice)"
    return runs


def out_dir() -> Path:
    return Path(sys.argv[1] if len(sys.argv) > 1 else os.environ["STOKER_TEST_OUT"])
