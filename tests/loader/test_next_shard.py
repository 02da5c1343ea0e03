"""Natural order's next shard opens in a background thread before a batch reaches it
(stoker.loader.read.next_shard): only after the current shard is open, only in natural order,
never past the last shard or after the source closed; the batches are the same bytes; and a
shard that cannot be opened ahead still fails at its own batch, naming the shard."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from shard_writer import write_dataset  # noqa: E402

from stoker.loader import DataLoader, ReadOptions, WorkerOptions  # noqa: E402
from stoker.loader.errors import WorkerError  # noqa: E402
from stoker.loader.fallbacks import drain  # noqa: E402
from stoker.loader.read.arrow import ArrowSource  # noqa: E402
from stoker.manifest import Manifest  # noqa: E402

COLUMNS = ["id", "x", "y"]


def _wait_open(source: ArrowSource, index: int) -> None:
    """Until shard ``index`` is open (the test's timeout bounds the wait)."""
    while index not in source.opened_shards:
        time.sleep(0.005)


@pytest.mark.timeout(60)
def test_the_shard_after_a_natural_task_opens_once_a_batch_opened_one(dataset: Path) -> None:
    source = ArrowSource(Manifest.load(str(dataset)), columns=COLUMNS)
    try:
        starts = source._starts
        shard0 = np.arange(starts[0], starts[1], dtype=np.int64)
        source.open_next([shard0[:8]])  # shard 0 not open yet: its own open comes first
        assert source._next.opened == 0 and not source._shards.is_open(1)
        source._shards.open(0)
        source.open_next([shard0[:8], shard0[8:16]])  # the last task decides
        _wait_open(source, 1)
        assert source._next.opened == 1 and not source._shards.is_open(2)
        source.open_next([shard0[8:16]])  # open already: nothing more
        shuffled = np.array([3, 1, 2, 0, 9], dtype=np.int64) + starts[1]
        source._shards.open(1)
        source.open_next([shuffled])  # not a run of consecutive ids
        last = len(starts) - 2
        source._shards.open(last)
        source.open_next([np.arange(starts[last], starts[last + 1], dtype=np.int64)])
        time.sleep(0.2)  # nothing was asked: nothing may open meanwhile
        assert source._next.opened == 1 and not source._shards.is_open(2)
        assert sorted(source.opened_shards) == [0, 1, last]
        # small shards: tasks handed out further ahead read several; those open too, in order
        source.open_next([np.arange(starts[2] + 1, starts[4] + 3, dtype=np.int64)])
        _wait_open(source, 5)
        assert source._next.opened == 5 and sorted(source.opened_shards) == [0, 1, 2, 3, 4, 5,
                                                                              last]
    finally:
        source.close()
    source.open_next([np.arange(starts[6], starts[7], dtype=np.int64)])  # closed: ignored
    assert not source._shards.is_open(7)


@pytest.mark.timeout(60)
def test_a_ranks_strided_share_opens_ahead_and_a_source_of_two_open_shards_does_not(
        dataset: Path) -> None:
    """A rank's share of natural order (every other id: world size 2) is natural order too;
    where the source holds at most 2 shards open (a small node cache), opening one ahead
    would close the least recently used, maybe the one being read: nothing opens ahead."""
    for max_open, opens in ((256, True), (2, False)):
        source = ArrowSource(Manifest.load(str(dataset)), columns=COLUMNS, max_open=max_open)
        try:
            starts = source._starts
            source._shards.open(0)
            source.open_next([np.arange(starts[0] + 1, starts[1], 2, dtype=np.int64)])
            if opens:
                _wait_open(source, 1)
            else:
                time.sleep(0.2)  # nothing was asked: nothing may open meanwhile
            assert source._next.opened == int(opens) and sorted(source.opened_shards) == \
                [0, 1][:1 + opens]
        finally:
            source.close()


@pytest.mark.timeout(60)
def test_a_shard_still_opening_ahead_when_the_source_closes_is_not_left_open(
        dataset: Path) -> None:
    """Its open finishes after the source closed: closed again, its opener's context (a
    cache pin) exited."""
    m = Manifest.load(str(dataset))
    root = Path(m.root.removeprefix("file://"))  # type: ignore[union-attr]
    inside, go, exited = threading.Event(), threading.Event(), []

    @contextlib.contextmanager
    def opener(index: int) -> Iterator[str]:
        if index == 1:  # the open ahead: held until the source closed
            inside.set()
            go.wait()
        try:
            yield str(root / m.shards[index].path)
        finally:
            exited.append(index)

    source = ArrowSource(m, columns=COLUMNS, opener=opener)
    source._shards.open(0)
    source.open_next([np.arange(0, 8, dtype=np.int64)])
    inside.wait()
    source.close()
    assert exited == [0]
    go.set()
    while source._next._asked:  # the open ahead ending (the test's timeout bounds it)
        time.sleep(0.005)
    assert exited == [0, 1] and not source._shards.is_open(1) and source._next.opened == 0


def _ids(dl: DataLoader) -> list[bytes]:
    return [b["id"].numpy().tobytes() + b["x"].numpy().tobytes() for b in dl]


@pytest.mark.parametrize("workers", [0, 2])
def test_natural_order_opens_shards_ahead_with_the_same_bytes(dataset: Path,
                                                              workers: int) -> None:
    """The reader thread and thread workers: the same batches as reading each when asked;
    shards opened ahead in natural order only, none in shuffled order."""
    want = _ids(DataLoader(str(dataset), columns=COLUMNS, batch_size=16, num_workers=0,
                           workers=WorkerOptions(read_ahead=False)))
    # prefetch 1: tasks are handed out a few shards ahead, not the whole epoch at once
    dl = DataLoader(str(dataset), columns=COLUMNS, batch_size=16, num_workers=workers,
                    prefetch_factor=1 if workers else None,
                    read=ReadOptions(row_major=True))
    assert _ids(dl) == want
    assert 0 < dl._source._next.opened <= 18  # 19 shards: all but the first, at most
    dl.close()
    shuffled = DataLoader(str(dataset), columns=COLUMNS, batch_size=16, shuffle=True, seed=3,
                          num_workers=workers, prefetch_factor=1 if workers else None)
    for _ in shuffled:
        pass
    assert shuffled._source._next.opened == 0
    shuffled.close()


def _broken_dataset(root: Path) -> Path:
    """6 shards of 40 rows, shard 4's IPC footer overwritten (same size, cannot open)."""
    tables = [pa.table({"id": np.arange(40 * s, 40 * s + 40),
                        "x": np.arange(40, dtype=np.float32)}) for s in range(6)]
    write_dataset(root, tables, batch_rows=8)
    broken = sorted(root.rglob("*.arrow"))[4]
    raw = bytearray(broken.read_bytes())
    raw[-40:-10] = b"\xff" * 30
    broken.write_bytes(bytes(raw))
    return root


@pytest.mark.timeout(60)
def test_a_shard_that_cannot_open_ahead_is_counted_and_fails_at_its_own_batch(
        tmp_path: Path) -> None:
    root = _broken_dataset(tmp_path / "data")
    source = ArrowSource(Manifest.load(str(root)), columns=["id", "x"])
    try:
        drain()
        source._shards.open(3)
        source.open_next([np.arange(150, 160, dtype=np.int64)])
        while source._next._asked:  # the attempt in progress (the test's timeout bounds it)
            time.sleep(0.005)
        noted = drain()
        assert noted["open_ahead_failed"][0] == 1 and "shard 4" in noted["open_ahead_failed"][1]
        assert source._next.opened == 0 and not source._shards.is_open(4)
        with pytest.raises(WorkerError, match="shard 4"):  # its own open meets the error
            source._shards.open(4)
    finally:
        source.close()

    loader = DataLoader(str(root), batch_size=8, columns=["id", "x"])
    rows: list[Any] = []
    with pytest.raises(WorkerError, match=r"shard 4 .*\(reading samples \[160, 161"):
        for batch in loader:
            rows.extend(batch["id"].tolist())
    assert rows == list(range(160))  # every batch before it, nothing skipped
