"""Staged reads (stoker.loader.read.staging) deliver exactly what the column path delivers: the same
batches, bytes and dtypes, for every worker mode, world size and resume point."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from stoker.loader import DataLoader, ReadOptions, ShuffleOptions, WorkerOptions

from loader_helpers import global_batches, run_with_resume  # noqa: E402

OPTIONS = [ShuffleOptions(partitions=4, block_size=8),
           ShuffleOptions(partitions=12, block_size=3, partition_mode="fixed"), ShuffleOptions()]


def _plain(batch: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in batch.items():
        out[k] = (str(v.dtype), tuple(v.shape), v.numpy().tobytes()) \
            if isinstance(v, torch.Tensor) else list(v)
    return out


@pytest.mark.parametrize("opts", OPTIONS)
@pytest.mark.parametrize("workers,mode", [(0, "thread"), (2, "thread"), (2, "process")])
def test_staged_batches_equal_the_column_path(dataset: Path, opts: dict, workers: int,
                                              mode: str) -> None:
    kw = dict(batch_size=16, shuffle=opts, seed=9)
    ref = [_plain(b) for b in DataLoader(str(dataset), read=ReadOptions(row_major=False), **kw)]
    dl = DataLoader(str(dataset), num_workers=workers, read=ReadOptions(row_major="staged"),
                    workers=WorkerOptions(mode=mode), **kw)
    assert dl._source.stager is not None
    got = [_plain(b) for b in dl]
    assert got == ref
    if mode == "thread":  # process workers stage in their own copies
        assert {"id", "x", "y"} <= {f.name for f in dl._source.stager.fields}  # served staged


def test_a_perturbed_staged_value_is_seen(dataset: Path) -> None:
    """The comparison above fails when one staged value is wrong."""
    kw = dict(batch_size=16, shuffle=ShuffleOptions(partitions=4, block_size=8), seed=9)
    ref = [_plain(b) for b in DataLoader(str(dataset), read=ReadOptions(row_major=False), **kw)]
    dl = DataLoader(str(dataset), read=ReadOptions(row_major="staged"), **kw)
    got = []
    for i, b in enumerate(dl):
        if i == 3:
            b["x"][5] = torch.nextafter(b["x"][5], torch.tensor(np.inf))
        got.append(_plain(b))
    assert got != ref


@pytest.mark.parametrize("world", [2, 4])
def test_staged_global_batches_are_the_same_for_every_world_size(dataset: Path,
                                                                 world: int) -> None:
    kw = dict(shuffle=ShuffleOptions(partitions=4, block_size=8), seed=3,
              read=ReadOptions(row_major="staged"))
    assert global_batches(str(dataset), world, 32, epoch=1, **kw) == \
        global_batches(str(dataset), 1, 32, epoch=1, **kw)


def test_staged_resume_continues_exactly(dataset: Path) -> None:
    kw = dict(batch_size=16, shuffle=ShuffleOptions(partitions=4, block_size=8), seed=5)

    def make(i: int) -> DataLoader:
        return DataLoader(str(dataset), num_workers=i % 3, read=ReadOptions(row_major="staged"),
                          **kw)

    straight = run_with_resume(lambda i: DataLoader(str(dataset),
                                                    read=ReadOptions(row_major=False),
                                                    **kw), [], 2)
    assert run_with_resume(make, [3, 11, 40, 41], 2) == straight
