"""Staged reads (stoker.loader.read.staging) deliver exactly what the column path delivers: the same
batches, bytes and dtypes, for every worker mode, world size and resume point."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
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


def _settled(dl: DataLoader) -> None:
    """Wait until the stager's background thread has finished what it was given."""
    pool = dl._source.stager._pool
    if pool is not None:
        pool.submit(lambda: None).result()


@pytest.mark.parametrize("next_epoch", [1, 5])
def test_the_next_epochs_first_round_is_staged_ahead(dataset: Path, next_epoch: int) -> None:
    """Reading the last round of epoch 0 stages round 0 of epoch 1 in the background, so
    epoch 1 does not start by waiting for it; an epoch other than the one guessed reads its
    own rounds. Batches are the column path's either way (columns that rounds hold: rounds
    are staged ahead only when they serve every output)."""
    kw = dict(batch_size=16, shuffle=ShuffleOptions(partitions=4, block_size=8), seed=9,
              columns=["id", "x", "y"])
    ref = DataLoader(str(dataset), read=ReadOptions(row_major=False), **kw)
    want = [[_plain(b) for b in ref] for _ in range(2)] if next_epoch == 1 else None
    if want is None:
        ref.set_epoch(0)
        want = [[_plain(b) for b in ref]]
        ref.set_epoch(next_epoch)
        want.append([_plain(b) for b in ref])
    # batches read in this thread when asked for: which rounds it stages itself is then
    # what the background staging left it, not how far a reader thread got ahead
    dl = DataLoader(str(dataset), read=ReadOptions(row_major="staged"),
                    workers=WorkerOptions(read_ahead=False), **kw)
    stager = dl._source.stager
    assert [_plain(b) for b in dl] == want[0]
    _settled(dl)
    ahead = stager._rounds.get((1, 9, 0))
    assert ahead is not None and ahead.ready
    built_here = []  # rounds this thread had to stage itself (the batch waited for them)
    build = stager._build

    def spy(order: Any, r: Any) -> None:
        if threading.current_thread() is threading.main_thread():
            built_here.append(r.key)
        build(order, r)

    stager._build = spy
    if next_epoch != 1:
        dl.set_epoch(next_epoch)
    it = iter(dl)
    first = _plain(next(it))
    assert built_here == ([] if next_epoch == 1 else [(next_epoch, 9, 0)])
    assert [first, *(_plain(b) for b in it)] == want[1]


def test_a_shard_is_announced_before_other_threads_can_read_it(dataset: Path) -> None:
    """Staging fixes its record layout (and the list fields that do not fit it) when a shard
    opens: the announcement comes before the shard is published to other threads, or a
    round staged by the background thread could read a shard it was not told of. A failing
    announcement leaves the shard closed."""
    from stoker.loader.read.arrow import ArrowSource
    from stoker.manifest import Manifest

    source = ArrowSource(Manifest.load(str(dataset)))
    shards = source._shards
    seen = []

    def opened(index: int, data: Any, batches: Any) -> None:
        seen.append((index, index in shards._open, shards.data.get(index) is data))
        if index == 4:
            raise RuntimeError("announcement failed")

    shards._on_opened = opened
    shards.table(3)
    assert seen == [(3, False, True)] and 3 in shards._open
    with pytest.raises(RuntimeError, match="announcement failed"):
        shards.table(4)
    assert 4 not in shards._open and 4 not in shards._opening and 4 not in shards.data


@pytest.mark.parametrize("opts", OPTIONS[:2])
def test_staged_batches_equal_the_column_path_with_every_copy_split(
        dataset: Path, opts: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A round's copies of a shard are split between the staging thread and a helper at a
    row (the copies of this small dataset are split only with a split size of one row)."""
    from stoker.loader.read import staging

    splits = []
    halves = staging._halves
    monkeypatch.setattr(staging, "_SPLIT_ROWS", 1)
    monkeypatch.setattr(staging, "_halves", lambda *a: splits.append(a[-1]) or halves(*a))
    kw = dict(batch_size=16, shuffle=opts, seed=9)
    ref = [_plain(b) for b in DataLoader(str(dataset), read=ReadOptions(row_major=False), **kw)]
    dl = DataLoader(str(dataset), read=ReadOptions(row_major="staged"), **kw)
    got = [_plain(b) for b in dl]
    dl.close()
    assert splits and got == ref


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 40)), min_size=1, max_size=12),
       st.data())
def test_halves_cut_runs_at_a_row(runs: list[tuple[int, int]], data: Any) -> None:
    """The two halves hold every (row, destination) of the runs once, the first exactly
    ``at`` of them, in order."""
    from stoker.loader.read.staging import _halves

    first = np.array([f for f, _ in runs], dtype=np.int64)
    end = first + np.array([n for _, n in runs], dtype=np.int64)
    dest = np.cumsum([0] + [n for _, n in runs[:-1]]).astype(np.int64) * 3
    total = int((end - first).sum())
    at = data.draw(st.integers(1, total - 1)) if total > 1 else 0
    if total < 2:
        return

    def pairs(f: np.ndarray, e: np.ndarray, d: np.ndarray) -> list[tuple[int, int]]:
        return [(r, int(to) + r - int(lo)) for lo, hi, to in zip(f, e, d) for r in range(lo, hi)]

    head, tail = _halves(first, end, dest, at)
    assert all(a.dtype == np.int64 for a in (*head, *tail))
    assert len(pairs(*head)) == at
    assert pairs(*head) + pairs(*tail) == pairs(first, end, dest)
