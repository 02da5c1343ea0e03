"""Workers read several batches per task (ArrowSource.fetch_group): the same batches, byte
for byte, as one at a time; a failure still belongs to its own batch."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from stoker.loader import DataLoader, ReadOptions, WorkerError, WorkerOptions
from stoker.loader.read.arrow import ArrowSource
from stoker.loader.workers.transport import LEASES

COLUMNS = ["id", "x", "y"]  # fixed widths: every output is served from records


def _raw(batch: dict[str, Any]) -> list[tuple[str, str, tuple[int, ...], bytes]]:
    return [(k, str(v.dtype), tuple(v.shape), v.numpy().tobytes()) for k, v in batch.items()]


def _loader(path: Path, **kw: Any) -> DataLoader:
    kw.setdefault("read", ReadOptions(row_major=True))
    kw.setdefault("batch_size", 16)
    return DataLoader(str(path), columns=COLUMNS, seed=5, **kw)


def _epochs(dl: DataLoader, epochs: int) -> list[Any]:
    out = []
    for e in range(epochs):
        dl.set_epoch(e)
        out += [_raw(b) for b in dl]
    return out


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("workers,mode", [(1, "thread"), (2, "thread"), (1, "process"),
                                          (2, "process")])
def test_grouped_batches_equal_one_at_a_time(dataset: Path, shuffle: bool, workers: int,
                                             mode: str) -> None:
    """Batches of a 615-sample epoch (the last one short) read in groups equal, byte for
    byte and in order, what num_workers=0 reads, over epochs; and groups were really used
    (process workers: handed out, and none read again batch by batch)."""
    ref = _loader(dataset, shuffle=shuffle)
    want = _epochs(ref, 3)
    ref.close()
    dl = _loader(dataset, shuffle=shuffle, num_workers=workers,
                 workers=WorkerOptions(mode=mode), persistent_workers=mode == "process")
    assert dl._group() == 8  # 8192 rows per group, batches of 16: at most 8
    for _ in dl:  # records build in the background: on a loaded machine they may not be
        pass      # there within three epochs this small, and groups need them
    dl._source.wait_row_major()
    got = _epochs(dl, 3)
    if mode == "thread":
        assert dl._source.batches_grouped > 0
    else:
        assert dl._pool.grouped > 0 and "group_retried" not in dl.stats.fallbacks
        assert dl._source.opened_shards  # opened here before the fork, for the workers
    dl.close()
    assert got == want
    flipped = [list(b) for b in want]
    k, dtype, shape, data = flipped[20][0]
    flipped[20][0] = (k, dtype, shape, bytes([data[0] ^ 1]) + data[1:])
    assert got != flipped  # the comparison can fail


def test_grouped_batches_keep_their_content_digests(dataset: Path, tmp_path: Path) -> None:
    """The ledger's content digests of grouped batches are those of batches read alone."""
    from stoker.loader import LedgerOptions
    from stoker.loader.ledger.reader import read_ledger

    digests = []
    for workers in (0, 2):
        path = tmp_path / f"ledger-{workers}"
        dl = _loader(dataset, shuffle=True, num_workers=workers,  # 0: read one at a time
                     workers=WorkerOptions(read_ahead=workers > 0),
                     ledger=LedgerOptions(path=str(path), content=True))
        for _ in dl:
            pass
        grouped = dl._source.batches_grouped
        why = (grouped, dl._group(), dict(dl.stats.fallbacks))  # shown if groups were not used
        dl.close()
        content = read_ledger(str(path)).segments[0].content
        assert content is not None and content.shape == (39, 3)
        digests.append(content)
        assert (grouped > 0) == (workers > 0), why
    assert np.array_equal(digests[0], digests[1])
    digests[1][7, 1] ^= 1
    assert not np.array_equal(digests[0], digests[1])  # the comparison can fail


def test_a_transform_failure_in_a_group_is_raised_at_its_own_batch(dataset: Path) -> None:
    """Batches before the failing one in the same group are delivered; the error names it."""
    def transform(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if int(batch["id"][0]) == 5 * 16:
            raise ValueError("bad batch")
        return batch

    dl = _loader(dataset, num_workers=2, transform=transform)
    seen = []
    with pytest.raises(ValueError, match="bad batch") as info:
        for b in dl:
            seen.append(int(b["id"][0]))
    assert seen == [16 * i for i in range(5)]
    assert "batch 5" in "".join(getattr(info.value, "__notes__", []))
    dl.close()


def test_a_group_that_cannot_be_read_at_once_is_read_batch_by_batch(
        dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A group read that raises is a named fallback: every batch is read again on its own
    (the same bytes), the loader counts it, nothing is lost."""
    ref = _loader(dataset)
    want = _epochs(ref, 1)
    ref.close()

    def broken(self: ArrowSource, batches: Any, *args: Any) -> Any:
        raise WorkerError(f"shard unreadable for samples {batches[0][:2].tolist()}")

    monkeypatch.setattr(ArrowSource, "fetch_group", broken)
    dl = _loader(dataset, num_workers=2)
    assert _epochs(dl, 1) == want
    assert dl.stats.fallbacks.get("group_retried", 0) >= 1
    dl.close()


def test_sources_whose_outputs_records_cannot_serve_are_not_grouped(dataset: Path) -> None:
    """A string column (never in records): one batch per task, as before."""
    dl = DataLoader(str(dataset), batch_size=16, columns=["id", "name"], num_workers=2,
                    read=ReadOptions(row_major=True))
    assert dl._group() == 1
    names = [n for b in dl for n in b["name"]]
    assert names == [f"s{i}" for i in range(615)]
    dl.close()


def test_a_list_column_of_varying_width_is_read_batch_by_batch(dataset: Path) -> None:
    """``seq`` has rows of 0-2 values: records do not serve it, so groups decline and every
    batch keeps its own padded width (what num_workers=0 gives)."""
    kw: dict[str, Any] = dict(batch_size=16, columns=["id", "seq"], seed=1, shuffle=True,
                              read=ReadOptions(row_major=True))
    want = [_raw(b) for b in DataLoader(str(dataset), **kw)]
    dl = DataLoader(str(dataset), num_workers=2, **kw)
    got = [_raw(b) for b in dl]
    assert dl._source.batches_grouped == 0
    dl.close()
    assert got == want
    assert len({shape for b in want for k, _, shape, _ in b if k == "seq"}) > 1


class _DieOnce:
    """A transform that kills its worker process at one batch, the first time only (a file
    marks that it happened: the restarted worker is a new process)."""

    def __init__(self, marker: Path, first_id: int) -> None:
        self.marker, self.first_id = marker, first_id

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if int(batch["id"][0]) == self.first_id and not self.marker.exists():
            self.marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return batch


def test_a_process_worker_killed_inside_a_group_loses_no_batch(dataset: Path,
                                                               tmp_path: Path) -> None:
    """A worker killed in the middle of a group: the batches it had not handed back are read
    again (one by one, by its replacement) and the epoch is byte for byte what
    num_workers=0 reads."""
    ref = _loader(dataset)
    want = _epochs(ref, 1)
    ref.close()
    dl = _loader(dataset, num_workers=2, workers=WorkerOptions(mode="process"),
                 persistent_workers=True, transform=_DieOnce(tmp_path / "died", 11 * 16))
    assert dl._group() == 8
    got = _epochs(dl, 1)
    assert dl._pool.restarts == 1 and dl._pool.grouped > 0
    dl.close()
    assert (tmp_path / "died").exists()
    assert got == want


@pytest.mark.parametrize("workers", [1, 2])
def test_staged_rounds_are_read_in_groups_byte_for_byte(dataset: Path, workers: int) -> None:
    """Shuffled rounds staged row-major (the path past the records budget): workers read
    several batches per staged gather, at most two rounds at once; every batch equals what
    num_workers=0 reads, over epochs."""
    staged = ReadOptions(row_major="staged")
    ref = _loader(dataset, shuffle=True, read=staged)
    want = _epochs(ref, 3)
    ref.close()
    dl = _loader(dataset, shuffle=True, read=staged, num_workers=workers)
    assert dl._source._stager is not None and dl._group() == 8
    got = _epochs(dl, 3)
    assert dl._source.batches_grouped > 0
    dl.close()
    assert got == want


def test_persistent_process_workers_survive_abandoned_iterations(dataset: Path) -> None:
    """Breaking out of an epoch leaves the workers' grouped tasks in flight, each holding a
    slot of its worker's ring until its stale result is read: the next iteration (which
    continues the epoch) must neither overwrite those slots (it raised RingError) nor lose
    or repeat a batch."""
    ref = _loader(dataset, shuffle=True)
    want = _epochs(ref, 3)
    ref.close()
    dl = _loader(dataset, shuffle=True, num_workers=2, workers=WorkerOptions(mode="process"),
                 persistent_workers=True)
    got = []
    for epoch, stop in enumerate((3, 1, 17)):
        dl.set_epoch(epoch)
        for i, b in enumerate(dl):
            got.append(_raw(b))
            if i == stop:
                break
        got += [_raw(b) for b in dl]  # the rest of the same epoch
    assert dl._pool.grouped > 0
    dl.close()
    assert got == want


def test_process_workers_lend_batches_and_copy_those_held_past_their_leases(
        dataset: Path) -> None:
    """Process workers' batches view their shared-memory slots (a group's batches one slot):
    a loop that drops each batch copies none, and a caller that keeps every batch
    (``list(loader)``) keeps them intact while the workers go on writing; past each ring's
    leases the batches are copies (counted)."""
    ref = _loader(dataset, shuffle=True, batch_size=4)
    want = _epochs(ref, 2)
    ref.close()
    dl = _loader(dataset, shuffle=True, batch_size=4, num_workers=2,
                 workers=WorkerOptions(mode="process"), persistent_workers=True)
    dl.set_epoch(0)
    got = [_raw(b) for b in dl]
    assert "batch_copied" not in dl.stats.fallbacks
    dl.set_epoch(1)
    held = list(dl)  # 154 batches in groups of 8: more than 2 rings x 8 leased slots
    for batch in held[:3]:  # the caller's to write: no other batch changes
        batch["x"].fill_(0)
    got += [_raw(b) for b in held[3:]]
    copied = dl.stats.fallbacks["batch_copied"]
    dl.close()
    assert 0 < copied <= len(held) - 2 * LEASES  # each ring lent its slots before it copied
    assert got == want[:len(want) - len(held)] + want[len(want) - len(held) + 3:]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_first_tasks_across_order_chunks_are_handed_out_without_a_deadlock(
        tmp_path: Path, mode: str) -> None:
    """Process workers' first tasks are computed while the fork gate is held (their shards
    open before the fork): ids past the first order chunk must not wait for the order
    thread, whose unit waits for that fork (it hung until a chunk not ready there was
    computed inline). 2 workers x 2 prefetch x groups of 8 batches of 1,000 ids cross the
    16,384-position chunk; every batch holds the order's ids."""
    from loader_helpers import make_dataset

    from stoker.loader.order.mixture_order import source_order
    from stoker.loader.order.schedule import rank_batch_ids

    make_dataset(tmp_path, [9000, 7000, 11000])
    dl = DataLoader(str(tmp_path), batch_size=1000, shuffle=True, seed=2, columns=["id"],
                    num_workers=2, workers=WorkerOptions(mode=mode))
    order = source_order(dl._source, 2, 0, dl.order_options)
    want = [rank_batch_ids(order, dl._plan, s).tolist() for s in range(len(dl))]
    try:
        assert [b["id"].tolist() for b in dl] == want
    finally:
        dl.close()
