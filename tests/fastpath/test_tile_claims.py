"""Tiles of records built in place for worker processes, by every process that reads them
(stoker.loader.fastpath.record_store.TileClaims, ShardRecords._join): each tile built once
across processes, a killed builder's tile built again, the published file the bytes of one
whole build, and a forked worker's natural-order batches the columns' bytes."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # for fastpath_helpers (importlib mode)

from fastpath_helpers import (count_tile_builds, open_shard, record_table,  # noqa: E402
                              write_dataset)

from stoker.loader import DataLoader, ReadOptions, WorkerOptions  # noqa: E402
from stoker.loader.fastpath import rowmajor  # noqa: E402
from stoker.loader.fastpath.plan import ShardData  # noqa: E402
from stoker.loader.fastpath.record_store import RecordStore  # noqa: E402
from stoker.loader.read.arrow import ArrowSource  # noqa: E402
from stoker.manifest import Manifest  # noqa: E402

FEATS, CATS, COLUMNS = ["f0", "f1"], ["c0"], ["id", "seq"]
SIZES = [700, 333]
TILE = 64
NAME = "shard0.rec"

fork = multiprocessing.get_context("fork")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Manifest:
    starts = np.concatenate([[0], np.cumsum(SIZES)])
    tables = [record_table(n, int(s), i) for i, (n, s) in enumerate(zip(SIZES, starts))]
    return write_dataset(tmp_path_factory.mktemp("claims"), tables, batch_rows=50)


@pytest.fixture
def small_tiles(monkeypatch: pytest.MonkeyPatch) -> Counter[int]:
    """Tiles of ``TILE`` rows; the builds of each tile by this process, by its first row."""
    return count_tile_builds(monkeypatch, TILE)


def _shard(m: Manifest) -> tuple[ShardData, rowmajor.RecordLayout]:
    _, data, layout = open_shard(m, 0, FEATS, CATS, COLUMNS)
    return data, layout


def _reader(store: RecordStore, data: ShardData, layout: rowmajor.RecordLayout,
            rows: tuple[int, int], built: Counter[int], out: Any, die_holding: bool) -> None:
    """A worker process: join the build, read ``rows`` through the tiles (or take tile 0's
    claim and be killed holding it), report the tiles it built and the bytes it read."""
    nbytes = SIZES[0] * layout.stride
    joined = store.join(NAME, nbytes, rowmajor.Tiles.count(SIZES[0]))
    assert joined is not None
    if die_holding:
        assert joined[1].claim(0)
        out.put("holding")
        out.close()
        out.join_thread()  # sent before the kill
        os.kill(os.getpid(), signal.SIGKILL)
    tiles = rowmajor.Tiles(layout, data, (), *joined)
    got = tiles.read(*rows).tobytes()
    out.put((sorted(built.elements()), got, tiles.built_everywhere()))


def _build_with(store: RecordStore, data: ShardData, layout: rowmajor.RecordLayout,
                built: Counter[int], rows: tuple[int, int], die_holding: bool = False
                ) -> tuple[np.ndarray | None, Any]:
    """Build shard 0's records in place while a forked reader joins the build first; what
    the store returns and the reader's report."""
    nbytes = SIZES[0] * layout.stride
    report: list[Any] = []

    def fill(out: np.ndarray, claims: Any) -> None:
        assert claims is not None
        q = fork.Queue()
        child = fork.Process(target=_reader, args=(store, data, layout, rows, built, q,
                                                   die_holding))
        child.start()
        report.append(q.get(timeout=60))
        child.join(30)
        assert child.exitcode == (-signal.SIGKILL if die_holding else 0)
        rowmajor.Tiles(layout, data, (), out, claims).build()

    return store.build(NAME, nbytes, fill, rowmajor.Tiles.count(SIZES[0])), report[0]


def _whole(data: ShardData, layout: rowmajor.RecordLayout) -> np.ndarray:
    rows = int(data.starts[-1])
    return rowmajor.build(layout, data, out=np.zeros(rows * layout.stride, np.uint8))


def _whole_and_store(dataset: Manifest, root: Path, built: Counter[int]
                     ) -> tuple[ShardData, rowmajor.RecordLayout, np.ndarray, RecordStore]:
    """Shard 0, its records in one build (not counted in ``built``), an empty store."""
    data, layout = _shard(dataset)
    want = _whole(data, layout)
    built.clear()
    return data, layout, want, RecordStore(str(root))


@pytest.mark.timeout(120)
def test_tiles_a_worker_built_are_not_built_again(dataset: Manifest, tmp_path: Path,
                                                  small_tiles: Counter[int]) -> None:
    data, layout, want, store = _whole_and_store(dataset, tmp_path, small_tiles)
    got, (theirs, read, complete) = _build_with(store, data, layout, small_tiles, (100, 300))
    assert theirs == [64, 128, 192, 256]  # the tiles rows 100-299 fall in, built there
    assert read == want[100:300].tobytes() and not complete
    assert small_tiles == Counter(t for t in range(0, SIZES[0], TILE) if t not in theirs)
    assert got is not None and got.tobytes() == want.tobytes()
    stored = store.open(NAME, got.nbytes)  # published with its digest
    assert stored is not None and stored.tobytes() == want.tobytes()
    assert store.join(NAME, got.nbytes, rowmajor.Tiles.count(SIZES[0])) is None  # over
    assert not list(tmp_path.glob("*.tiles")) and not list(tmp_path.glob(".claims-*"))


@pytest.mark.timeout(120)
def test_a_tile_whose_builder_was_killed_is_built_again(dataset: Manifest, tmp_path: Path,
                                                         small_tiles: Counter[int]) -> None:
    """The claim's lock goes with its process; its tile is not marked built."""
    data, layout, want, store = _whole_and_store(dataset, tmp_path, small_tiles)
    got, said = _build_with(store, data, layout, small_tiles, (0, 1), die_holding=True)
    assert said == "holding"
    assert small_tiles == Counter(range(0, SIZES[0], TILE))  # tile 0 included, each once
    assert got is not None and got.tobytes() == want.tobytes()


def test_no_build_under_way_is_joined(dataset: Manifest, tmp_path: Path) -> None:
    data, layout = _shard(dataset)
    store = RecordStore(str(tmp_path))
    assert store.join(NAME, SIZES[0] * layout.stride, 3) is None
    (tmp_path / (NAME + ".tiles")).write_bytes(b"\0" * 10)  # another size: not these tiles
    assert store.join(NAME, SIZES[0] * layout.stride, 3) is None


def _bytes(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v.numpy().tobytes() if isinstance(v, torch.Tensor) else v
            for k, v in batch.items()}


def _natural(src: ArrowSource) -> list[dict[str, Any]]:
    """Every row, in batches of 100 in natural order."""
    return [_bytes(src.fetch(np.arange(lo, min(lo + 100, sum(SIZES)))))
            for lo in range(0, sum(SIZES), 100)]


def _fetch_natural(src: ArrowSource, out: Any) -> None:
    out.put((_natural(src), src.rows_from_tiles, src.records_waits))


@pytest.mark.timeout(120)
def test_a_forked_workers_natural_batches_build_and_read_its_loaders_tiles(
        dataset: Manifest, tmp_path: Path, small_tiles: Counter[int],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Records built in place for worker processes (``for_workers``), the builders slowed:
    a forked worker's natural-order batches build the tiles they read, give the columns'
    bytes, and the files published are those of builds in memory."""
    monkeypatch.setenv("STOKER_COLD_START", "wait")  # the builders' kernels compile here
    real = rowmajor.Tiles.build

    def slow(self: rowmajor.Tiles) -> np.ndarray:
        time.sleep(1.0)
        return real(self)

    monkeypatch.setattr(rowmajor.Tiles, "build", slow)
    columns = ArrowSource(dataset, features=FEATS, categoricals=CATS, row_major=False)
    want = _natural(columns)
    src = ArrowSource(dataset, features=FEATS, categoricals=CATS, row_major="auto",
                      row_major_dir=str(tmp_path / "records"))
    try:
        src.open_for_workers([np.arange(0, 100)])  # shard 0's task: shards 0 and 1 build
        assert len(src._rm._builds) == 2  # type: ignore[union-attr]
        # fork once both builds are under way (their claims published; each then sleeps a
        # second): a child forked before would find nothing to join and read the columns.
        # Builds that never start end the test at its timeout mark.
        while len(list((tmp_path / "records").glob("*.tiles"))) < 2:
            time.sleep(0.01)
        src._firsts = 0  # a worker past its first batch
        q = fork.Queue()
        child = fork.Process(target=_fetch_natural, args=(src, q))
        child.start()
        got, from_tiles, waits = q.get(timeout=60)
        child.join(30)
        assert got == want
        assert from_tiles == sum(SIZES) and waits == 0  # none waited for a whole file
        src.wait_row_major()
        in_memory = ArrowSource(dataset, features=FEATS, categoricals=CATS, row_major=True,
                                row_major_dir=None)
        try:
            in_memory.fetch(np.arange(sum(SIZES)))
            in_memory.wait_row_major()
            files = sorted(p.read_bytes()[:-16] for p in (tmp_path / "records").glob("*.rec"))
            assert files == sorted(in_memory._records._records[i].tobytes()  # type: ignore
                                   for i in (0, 1))
        finally:
            in_memory.close()
    finally:
        src.close()
        columns.close()


def test_two_process_workers_natural_first_run_gives_the_columns_bytes(
        dataset: Manifest, tmp_path: Path, small_tiles: Counter[int],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The loader end to end: 2 process workers, natural order, no records stored; then a
    later run maps the files it published, with the same batches."""
    monkeypatch.setenv("STOKER_ROW_MAJOR_DIR", str(tmp_path))

    def run(row_major: Any, workers: int) -> list[dict[str, Any]]:
        dl = DataLoader(dataset.root, batch_size=40, shuffle=False, columns=COLUMNS,
                        num_workers=workers, workers=WorkerOptions(mode="process"),
                        read=ReadOptions(features=FEATS, categoricals=CATS,
                                         row_major=row_major))
        try:
            return [_bytes(b) for b in dl]
        finally:
            dl.close()

    want = run(False, 0)
    assert run("auto", 2) == want
    assert len(list(tmp_path.glob("*.rec"))) == 2
    assert run("auto", 2) == want
