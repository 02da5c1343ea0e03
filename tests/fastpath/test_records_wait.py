"""A shuffled batch waits for the records of its shards that this process is building
(stoker.loader.read.arrow.ArrowSource._wait_for_records): from the second batch on, never in
natural order (it reads tiles), never for a build a forked worker inherited, and never with
other bytes; a forked worker's batch waits, in either order, for the records its loader's
process writes for it."""

from __future__ import annotations

import itertools
import multiprocessing
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # for fastpath_helpers (importlib mode)

from fastpath_helpers import record_table, write_dataset  # noqa: E402

from stoker.loader.fastpath import rowmajor  # noqa: E402
from stoker.loader.read import arrow  # noqa: E402
from stoker.loader.read.arrow import ArrowSource  # noqa: E402
from stoker.manifest import Manifest  # noqa: E402

FEATS, CATS = ["f0", "f1"], ["c0"]
BUILD_S = 0.4  # each build's extra time: batches meanwhile would read the columns


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Manifest:
    tables = [record_table(n, start, s) for s, (n, start) in enumerate([(60, 0), (45, 60)])]
    return write_dataset(tmp_path_factory.mktemp("wait"), tables, batch_rows=8)


@pytest.fixture
def slow_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOKER_COLD_START", "wait")  # the builds' kernels need no compile here
    real = rowmajor.Tiles.build

    def slow(self: rowmajor.Tiles) -> np.ndarray:
        time.sleep(BUILD_S)
        return real(self)

    monkeypatch.setattr(rowmajor.Tiles, "build", slow)


def _bytes(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v.numpy().tobytes() if isinstance(v, torch.Tensor) else v
            for k, v in batch.items()}


def _source(m: Manifest, where: Path) -> ArrowSource:
    return ArrowSource(m, features=FEATS, categoricals=CATS, row_major="auto",
                       row_major_dir=str(where))


def _expected(m: Manifest, ids: np.ndarray) -> dict[str, Any]:
    columns = ArrowSource(m, features=FEATS, categoricals=CATS, row_major=False)
    try:
        return _bytes(columns.fetch(ids))
    finally:
        columns.close()


def test_the_second_shuffled_batch_waits_for_the_builds_of_its_shards(
        dataset: Manifest, tmp_path: Path, slow_builds: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the source's clock (read around each wait only) ticks 0.5 s a reading: the wait's
    # seconds are counted from it, whatever the machine's speed
    clock = SimpleNamespace(perf_counter=itertools.count(0, 0.5).__next__)
    monkeypatch.setattr(arrow, "time", clock)
    ids = np.random.default_rng(2).permutation(105)
    first, second = ids[:40], ids[40:80]
    src = _source(dataset, tmp_path)
    try:
        assert _bytes(src.fetch(first)) == _expected(dataset, first)  # from the columns
        assert src.records_waits == 0 and not len(src._records)  # the first never waits
        assert _bytes(src.fetch(second)) == _expected(dataset, second)
        assert src.records_waits == 1 and src.records_wait_s == 0.5
        assert sorted(src._records._records) == [0, 1]  # built before it was gathered
        src.fetch(ids[80:])
        assert src.records_waits == 1  # nothing left to wait for
    finally:
        src.close()


def test_natural_order_never_waits(dataset: Manifest, tmp_path: Path, slow_builds: None) -> None:
    src = _source(dataset, tmp_path)
    try:
        for at in range(0, 105, 20):
            ids = np.arange(at, min(at + 20, 105))
            assert _bytes(src.fetch(ids)) == _expected(dataset, ids)
        assert src.records_waits == 0
    finally:
        src.close()


def _wait_in_child(src: ArrowSource, out: Any) -> None:
    t0 = time.monotonic()
    waited = src._rm.wait_built(np.array([0, 1]))  # type: ignore[union-attr]
    out.put((waited, time.monotonic() - t0))


@pytest.mark.timeout(60)
def test_a_forked_worker_never_waits_for_its_parents_builds(
        dataset: Manifest, tmp_path: Path, slow_builds: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its copies of the parent's build futures never finish: waiting on them hung forever."""
    monkeypatch.setattr(sys.modules[__name__], "BUILD_S", 3.0)
    src = _source(dataset, tmp_path)
    try:
        src.fetch(np.random.default_rng(3).permutation(105)[:40])  # both builds under way
        assert len(src._rm._builds) == 2  # type: ignore[union-attr]
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        child = ctx.Process(target=_wait_in_child, args=(src, out))
        child.start()
        child.join(20)
        alive = child.is_alive()
        if alive:
            child.kill()
            child.join()
        assert not alive, "the forked child waited for its parent's builds"
        waited, took = out.get(timeout=5)
        assert waited is False and took < 1.0
    finally:
        src.close()


def _fetch_in_worker(src: ArrowSource, ids: np.ndarray, out: Any) -> None:
    got = _bytes(src.fetch(ids))
    out.put((got, src.records_waits, sorted(src._records._records)))  # type: ignore[union-attr]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shuffled", [True, False], ids=["shuffled", "natural order"])
def test_a_forked_worker_waits_for_the_records_its_loader_writes_for_it(
        dataset: Manifest, tmp_path: Path, slow_builds: None, shuffled: bool) -> None:
    """Records built for worker processes (``for_workers``: written in place into the store,
    under the file's lock) are waited for by a forked worker's batch, then mapped: it reads
    them instead of the columns, with the same bytes."""
    src = _source(dataset, tmp_path)
    src._rm.for_workers = True  # type: ignore[union-attr] - as open_for_workers sets it
    ids = np.random.default_rng(4).permutation(105) if shuffled else np.arange(105)
    try:
        src.open_for_workers([ids[:40]])  # natural order: shard 0's task opens shard 1 too
        assert len(src._rm._builds) == 2  # type: ignore[union-attr] - each holds its lock
        src._firsts = 0  # a worker past its first batch (which waits for nothing)
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        child = ctx.Process(target=_fetch_in_worker, args=(src, ids[40:80], out))
        child.start()
        got, waits, mapped = out.get(timeout=30)
        child.join(10)
        assert got == _expected(dataset, ids[40:80])
        assert waits == 1 and mapped == [0, 1]  # both written meanwhile, both mapped
    finally:
        src.close()


def test_natural_tasks_for_workers_open_the_next_shard_too(dataset: Manifest,
                                                            tmp_path: Path) -> None:
    """Process workers in natural order: the loader's process opens (and builds the records
    of) the shard after a task's last row as well, so that they are built while the workers
    read the task's shard; a shuffled task opens its own shards only."""
    for task, opened in ((np.arange(8, 24), [0, 1]), (np.arange(70, 90), [1]),
                         (np.array([3, 9, 4, 20]), [0])):
        src = _source(dataset, tmp_path / str(task[0]))  # no records stored
        try:
            src.open_for_workers([np.arange(0, 0), task])
            assert sorted(src._opened_ahead) == opened, task
            assert src._rm.for_workers  # type: ignore[union-attr]
        finally:
            src.close()


def test_a_first_group_read_batch_by_batch_waits_for_nothing(
        dataset: Manifest, tmp_path: Path, slow_builds: None) -> None:
    """A worker's first group of batches, without records, is read batch by batch and
    delivered whole: none of them waits for the builds (the first batch would wait for
    them all); the batch after the group does."""
    src = _source(dataset, tmp_path)
    ids = np.random.default_rng(5).permutation(105)
    batches = [ids[i:i + 16] for i in range(0, 64, 16)]
    try:
        assert src.fetch_group(batches[:3], 0, 0, None) is None  # rows without records
        for b in batches[:3]:
            assert _bytes(src.fetch(b)) == _expected(dataset, b)
        assert src.records_waits == 0
        assert _bytes(src.fetch(batches[3])) == _expected(dataset, batches[3])
        assert src.records_waits == 1
    finally:
        src.close()
