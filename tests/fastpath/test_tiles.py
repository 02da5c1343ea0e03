"""Records built a tile at a time by several threads (stoker.loader.fastpath.rowmajor.Tiles):
the shard's builder from the last tile back, natural-order batches from the first one on
(stoker.loader.read.arrow.ArrowSource._gather_tiles). Every tile is built once, the records
are the bytes of one whole build, and a batch read from tiles is the batch the columns give.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter, defaultdict
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
from stoker.loader.read.arrow import ArrowSource  # noqa: E402
from stoker.manifest import Manifest  # noqa: E402

FEATS, CATS, COLUMNS = ["f0", "f1"], ["c0"], ["id", "seq"]
SIZES = [700, 333]
TILE = 64


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Manifest:
    starts = np.concatenate([[0], np.cumsum(SIZES)])
    tables = [record_table(n, int(s), i) for i, (n, s) in enumerate(zip(SIZES, starts))]
    return write_dataset(tmp_path_factory.mktemp("tiles"), tables, batch_rows=50)


@pytest.fixture
def small_tiles(monkeypatch: pytest.MonkeyPatch) -> Counter[int]:
    """Tiles of ``TILE`` rows; counts the builds of each tile (by its first row)."""
    return count_tile_builds(monkeypatch, TILE)


def _shard(m: Manifest, index: int) -> tuple[ShardData, rowmajor.RecordLayout]:
    _, data, layout = open_shard(m, index, FEATS, CATS, COLUMNS)
    return data, layout


def _whole(data: ShardData, layout: rowmajor.RecordLayout) -> np.ndarray:
    """The shard's records in one copy of all its rows (no tiles)."""
    rows = int(data.starts[-1])
    rec = np.zeros((rows, layout.stride), dtype=np.uint8)
    one = np.zeros(1, dtype=np.int64)
    rowmajor.copy_runs(rec, layout.fields, data, one, one + rows, one)
    return rec


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_reader_and_the_builder_build_each_tile_once(dataset: Manifest, seed: int,
                                                       small_tiles: Counter[int]) -> None:
    data, layout = _shard(dataset, 0)
    want = _whole(data, layout)
    small_tiles.clear()
    tiles = rowmajor.Tiles(layout, data)
    builder = threading.Thread(target=tiles.build)
    builder.start()
    rng = np.random.default_rng(seed)
    lo = 0
    while lo < SIZES[0]:  # natural order: runs of any length, front to back
        hi = min(SIZES[0], lo + int(rng.integers(1, 3 * TILE)))
        assert tiles.read(lo, hi).tobytes() == want[lo:hi].tobytes()
        lo = hi
    builder.join()
    assert tiles.records.tobytes() == want.tobytes()
    assert small_tiles == Counter(range(0, SIZES[0], TILE))  # every tile, once


def test_the_builder_alone_builds_every_tile(dataset: Manifest,
                                             small_tiles: Counter[int]) -> None:
    data, layout = _shard(dataset, 1)
    want = _whole(data, layout)
    small_tiles.clear()
    assert rowmajor.build(layout, data).tobytes() == want.tobytes()
    assert small_tiles == Counter(range(0, SIZES[1], TILE))


def test_a_tile_whose_build_fails_is_built_again_by_another_thread(
        dataset: Manifest, small_tiles: Counter[int], monkeypatch: pytest.MonkeyPatch) -> None:
    data, layout = _shard(dataset, 1)
    want = _whole(data, layout)
    counted = rowmajor.copy_runs
    failed: list[int] = []

    def first_fails(rec: np.ndarray, fields: Any, d: Any, first: np.ndarray, *rest: Any) -> None:
        if not failed:
            failed.append(int(first[0]))
            raise MemoryError("no memory for this tile")
        counted(rec, fields, d, first, *rest)

    monkeypatch.setattr(rowmajor, "copy_runs", first_fails)
    small_tiles.clear()
    tiles = rowmajor.Tiles(layout, data)
    with pytest.raises(MemoryError):
        tiles.read(0, 10)
    assert failed == [0] and small_tiles == Counter()
    assert tiles.build().tobytes() == want.tobytes()  # tile 0 was given back untouched
    assert small_tiles == Counter(range(0, SIZES[1], TILE))


def test_a_read_waiting_for_its_tile_builds_the_next_untaken_ones(
        dataset: Manifest, small_tiles: Counter[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Thread A builds tile 0 (held until B has built what it may); B reads rows of tile 0
    meanwhile: it builds tiles 1 and 2 (``_READ_AHEAD``), not 3, waits, and gets tile 0's
    rows once A is done. Each tile once; the records are one whole build's bytes."""
    data, layout = _shard(dataset, 0)
    want = _whole(data, layout)
    counted = rowmajor.copy_runs
    hold, ahead_built = threading.Event(), threading.Event()
    by: dict[int, str] = {}

    def held(rec: np.ndarray, fields: Any, d: Any, first: np.ndarray, *rest: Any) -> None:
        tile = int(first[0]) // TILE
        by[tile] = threading.current_thread().name
        if tile == 0:
            assert hold.wait(10)
        counted(rec, fields, d, first, *rest)
        if tile == rowmajor._READ_AHEAD:
            ahead_built.set()

    monkeypatch.setattr(rowmajor, "copy_runs", held)
    small_tiles.clear()
    tiles = rowmajor.Tiles(layout, data)
    a = threading.Thread(target=tiles.read, args=(0, 10), name="A")
    a.start()
    while not by:  # A took tile 0
        time.sleep(0.001)
    got: list[bytes] = []
    b = threading.Thread(target=lambda: got.append(tiles.read(5, TILE).tobytes()), name="B")
    b.start()
    assert ahead_built.wait(10)
    time.sleep(0.05)  # B now waits for tile 0 and builds no further tile
    assert by == {0: "A", 1: "B", 2: "B"} and not got
    hold.set()
    a.join(10)
    b.join(10)
    assert got == [want[5:TILE].tobytes()]
    assert tiles.build().tobytes() == want.tobytes()
    assert small_tiles == Counter(range(0, SIZES[0], TILE))  # every tile, once


def _bytes(batch: dict[str, Any]) -> dict[str, Any]:
    """Every output as (dtype, shape, raw bytes): bitwise, NaNs included."""
    return {k: (v.dtype, tuple(v.shape), v.numpy().tobytes()) if isinstance(v, torch.Tensor)
            else v for k, v in batch.items()}


def _loader(m: Manifest, row_major: str | bool, workers: int) -> DataLoader:
    return DataLoader(m.root, batch_size=48, shuffle=False, columns=COLUMNS,
                      num_workers=workers, workers=WorkerOptions(mode="thread"),
                      read=ReadOptions(features=FEATS, categoricals=CATS, row_major=row_major))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_natural_first_run_reads_tiles_and_gives_the_columns_bytes(
        dataset: Manifest, tmp_path: Path, workers: int, small_tiles: Counter[int],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A node's first run in natural order: batches build the tiles they read while the
    builders wait (here: until the epoch is over), and every batch is the one the columns
    give; the records the builders then finish are saved whole."""
    epoch_over = threading.Event()
    real = rowmajor.Tiles.build

    def late(self: rowmajor.Tiles) -> np.ndarray:
        epoch_over.wait(30)
        return real(self)

    monkeypatch.setattr(rowmajor.Tiles, "build", late)
    monkeypatch.setenv("STOKER_ROW_MAJOR_DIR", str(tmp_path))
    want = [_bytes(b) for b in _loader(dataset, False, 0)]
    dl = _loader(dataset, "auto", workers)
    got = [_bytes(b) for b in dl]
    assert got == want
    source = dl._source
    assert source.rows_from_tiles > sum(SIZES) // 2  # the builders did not start
    epoch_over.set()
    source.wait_row_major()
    assert sorted(source._records._records) == [0, 1]
    assert len(list(tmp_path.glob("*.rec"))) == 2
    assert [_bytes(b) for b in _loader(dataset, "auto", workers)] == want  # from the files


def test_a_batch_whose_tiles_cannot_be_built_reads_the_columns(
        dataset: Manifest, tmp_path: Path, small_tiles: Counter[int],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A tile build that fails in a batch's thread is the counted ``row_major_failed``
    fallback: the batch comes from the columns, with the columns' bytes. The builders start
    late, so every batch finds the records still being built (else a fast builder could
    finish them before any batch asks for tiles)."""
    def no_memory(self: rowmajor.Tiles, lo: int, hi: int) -> np.ndarray:
        raise MemoryError(f"rows {lo}-{hi}")

    real = rowmajor.Tiles.build

    def late(self: rowmajor.Tiles) -> np.ndarray:
        time.sleep(1.0)
        return real(self)

    monkeypatch.setattr(rowmajor.Tiles, "read", no_memory)
    monkeypatch.setattr(rowmajor.Tiles, "build", late)
    monkeypatch.setenv("STOKER_ROW_MAJOR_DIR", str(tmp_path))
    want = [_bytes(b) for b in _loader(dataset, False, 0)]
    dl = _loader(dataset, "auto", 0)
    assert [_bytes(b) for b in dl] == want
    assert dl._source.rows_from_tiles == 0
    assert dl.stats.fallbacks.get("row_major_failed", 0) > 0
    dl._source.wait_row_major()  # no build of this loader left running into the next test
    dl.close()


def test_a_build_into_a_file_s_map_faults_each_tile_in_at_once(
        dataset: Manifest, small_tiles: Counter[int], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """Records built in place into a file's shared map (what process workers read) have
    each tile's pages faulted in by one populate call before it is written, as anonymous
    records do (page by page, those write faults were most of a first run's), and hold
    the bytes of one whole build."""
    import mmap

    from stoker.loader.fastpath import ring

    data, layout = _shard(dataset, 0)
    want = _whole(data, layout)
    rows = int(data.starts[-1])
    path = tmp_path / "records.rec"
    path.write_bytes(b"\0" * (rows * layout.stride))
    populated: list[tuple[int, int]] = []
    real = ring.populate

    def populate(arr: np.ndarray) -> bool:
        populated.append((arr.ctypes.data, arr.nbytes))
        return real(arr)

    monkeypatch.setattr(rowmajor, "populate", populate)
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        out = np.frombuffer(mm, dtype=np.uint8)
        try:
            assert rowmajor.build(layout, data, out=out).tobytes() == want.tobytes()
            base = out.ctypes.data
            # this build's calls: an earlier test's loader may still build in the background
            tiles = sorted((a - base, n) for a, n in populated if base <= a < base + out.nbytes)
        finally:
            del out
    assert tiles == [(lo * layout.stride, (min(rows, lo + TILE) - lo) * layout.stride)
                     for lo in range(0, rows, TILE)]
    assert path.read_bytes() == want.tobytes()


def test_a_builder_done_early_helps_build_the_shard_another_builder_builds(
        dataset: Manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two builder threads, two shards of 11 and 6 tiles: the thread that finished the small
    shard builds tiles of the large one too, each tile once, and the records are the bytes
    of one whole build (a shuffled first run waits for the last shard's records)."""
    wants = [_whole(*_shard(dataset, i)) for i in (0, 1)]
    monkeypatch.setattr(rowmajor.Tiles, "TILE_ROWS", TILE)
    builders: defaultdict[int, set[str]] = defaultdict(set)  # shard rows -> builder threads
    tiles: Counter[tuple[int, int]] = Counter()  # (shard rows, tile's first row) -> builds
    real = rowmajor.copy_runs

    def slow(rec: np.ndarray, fields: Any, data: Any, first: np.ndarray, *rest: Any) -> None:
        if rec.shape[0] in SIZES:  # a shard's records (not the kernels' warm-up)
            time.sleep(0.02)
            builders[rec.shape[0]].add(threading.current_thread().name)
            tiles[rec.shape[0], int(first[0])] += 1
        real(rec, fields, data, first, *rest)

    monkeypatch.setattr(rowmajor, "copy_runs", slow)
    source = ArrowSource(dataset, features=FEATS, categoricals=CATS, columns=COLUMNS,
                         row_major="auto", row_major_dir=str(tmp_path))
    source.fetch(np.random.default_rng(0).permutation(sum(SIZES)))  # shuffled: no tile read
    source.wait_row_major()
    assert len(builders[SIZES[0]]) == 2 and len(builders[SIZES[1]]) == 1
    assert tiles == Counter((n, lo) for n in SIZES for lo in range(0, n, TILE))
    for i, want in enumerate(wants):
        assert source._records._records[i].tobytes() == want.tobytes()


def test_a_helper_whose_tile_fails_stops_helping_and_the_shard_is_built_whole(
        dataset: Manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A tile a helping builder cannot build goes back to the shard's own builder: the
    records are the bytes of one whole build, and the helper's failure is logged naming the
    shard."""
    wants = [_whole(*_shard(dataset, i)) for i in (0, 1)]
    monkeypatch.setattr(rowmajor.Tiles, "TILE_ROWS", TILE)
    real_copy = rowmajor.copy_runs

    def slow(rec: np.ndarray, *args: Any) -> None:
        if rec.shape[0] in SIZES:
            time.sleep(0.02)
        real_copy(rec, *args)

    def failing(self: rowmajor.Tiles) -> bool:
        t = self._take_last()
        if t is None:
            return False
        with self._cond:  # given back untouched, as _make gives back a tile it fails
            self._state[t] = rowmajor._FREE
            self._cond.notify_all()
        raise MemoryError("no memory for a helper's tile")

    monkeypatch.setattr(rowmajor, "copy_runs", slow)
    monkeypatch.setattr(rowmajor.Tiles, "help", failing)
    source = ArrowSource(dataset, features=FEATS, categoricals=CATS, columns=COLUMNS,
                         row_major="auto", row_major_dir=str(tmp_path))
    with caplog.at_level("WARNING", logger="stoker.loader.fastpath.shard_records"):
        source.fetch(np.random.default_rng(1).permutation(sum(SIZES)))
        source.wait_row_major()
    assert "stopped helping with shard 0" in caplog.text
    for i, want in enumerate(wants):
        assert source._records._records[i].tobytes() == want.tobytes()
