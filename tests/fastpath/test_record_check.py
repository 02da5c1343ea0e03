"""Stored row-major records are checked against their shard before they are served (issue 14).

A record file's trailing xxh3-128 can be rewritten together with its bytes (a stale or buggy
build leaves exactly that). The loader must then neither serve the file's values nor trust it
again: the first and last rows and rows drawn at random are recomputed from the shard's
columns (stoker.loader.fastpath.record_check); a file that differs is a counted
``records_mismatch`` fallback, deleted, and rebuilt from the shard. Untampered files are
served as before, with no fallback and no rebuild.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
import xxhash

sys.path.insert(0, str(Path(__file__).parent))  # for fastpath_helpers (importlib mode)

from fastpath_helpers import open_shard, record_table, write_dataset  # noqa: E402

from stoker.loader import DataLoader, ReadOptions, WorkerOptions  # noqa: E402
from stoker.loader.fallbacks import collecting  # noqa: E402
from stoker.loader.fastpath import record_check, rowmajor  # noqa: E402
from stoker.loader.fastpath.plan import FastPlan, ShardData  # noqa: E402
from stoker.loader.fastpath.record_store import RecordStore  # noqa: E402
from stoker.loader.read.arrow import ArrowSource  # noqa: E402
from stoker.manifest import Manifest  # noqa: E402

FEATS, CATS, COLUMNS = ["f0", "f1"], ["c0"], ["id", "seq"]
SIZES = [300, 45, 60]  # shard 0 has more rows than the default sample checks
MODES = [(0, "thread"), (2, "thread"), (1, "process")]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Manifest:
    starts = np.concatenate([[0], np.cumsum(SIZES)])
    tables = [record_table(n, int(s), i) for i, (n, s) in enumerate(zip(SIZES, starts))]
    return write_dataset(tmp_path_factory.mktemp("checked"), tables, batch_rows=32)


def _shard(m: Manifest, index: int) -> tuple[FastPlan, ShardData, rowmajor.RecordLayout]:
    """Shard ``index`` opened as the loader opens it, and its record layout."""
    return open_shard(m, index, FEATS, CATS, COLUMNS)


def _file(m: Manifest, store: Path, index: int) -> tuple[Path, rowmajor.RecordLayout]:
    """Shard ``index``'s record file in ``store``, and its layout."""
    _, _, layout = _shard(m, index)
    return store / RecordStore.name(m.shards[index].xxh3_128, SIZES[index], layout.key()), \
        layout


def _tamper(path: Path, layout: rowmajor.RecordLayout, row: int) -> bytes:
    """Flip the bytes of ``row``'s features in a record file and rewrite the file's own
    checksum (what a stale or buggy build leaves); returns the original file."""
    original = path.read_bytes()
    body = bytearray(original[:-16])
    field = next(f for f in layout.fields if f.name == "features")
    at = row * layout.stride + field.offset
    body[at:at + field.nbytes] = bytes(b ^ 0x5A for b in body[at:at + field.nbytes])
    path.write_bytes(bytes(body) + xxhash.xxh3_128_digest(bytes(body)))
    return original


def _loader(m: Manifest, store: Path, workers: int = 0, mode: str = "thread",
            row_major: bool | str = True) -> DataLoader:
    return DataLoader(m.root, batch_size=16, shuffle=False, columns=COLUMNS,
                      num_workers=workers, workers=WorkerOptions(mode=mode),
                      read=ReadOptions(features=FEATS, categoricals=CATS, row_major=row_major,
                                       records_dir=store if store else False))


def _batches(dl: DataLoader) -> list[dict[str, Any]]:
    out = [{k: (v.dtype, tuple(v.shape), v.numpy().tobytes()) if isinstance(v, torch.Tensor)
            else v for k, v in b.items()} for b in dl]
    dl._source.wait_row_major()  # the records rebuilt in this process are saved
    dl.close()
    return out


@pytest.fixture(scope="module")
def expected(dataset: Manifest) -> list[dict[str, Any]]:
    """Every batch from the shards' columns (no records at all)."""
    return _batches(_loader(dataset, None, row_major=False))  # type: ignore[arg-type]


def _stored(m: Manifest, store: Path) -> None:
    _batches(_loader(m, store))
    assert len(list(store.glob("*.rec"))) == len(SIZES)


@pytest.mark.parametrize("workers,mode", MODES)
def test_tampered_records_with_a_rewritten_checksum_are_rebuilt_not_served(
        dataset: Manifest, expected: list[dict[str, Any]], tmp_path: Path, workers: int,
        mode: str) -> None:
    _stored(dataset, tmp_path)
    victim, layout = _file(dataset, tmp_path, 0)
    original = _tamper(victim, layout, row=0)  # the case: bytes at the start of the file
    dl = _loader(dataset, tmp_path, workers, mode)
    assert _batches(dl) == expected  # not one tampered value was served
    assert dl.stats.fallbacks == {"records_mismatch": 1}
    if mode == "thread":  # rebuilt from the shard and saved again, byte for byte
        assert victim.read_bytes() == original
    else:  # deleted by the worker (its save may end with the worker): never kept
        assert not victim.exists() or victim.read_bytes() == original
    again = _loader(dataset, tmp_path)
    assert _batches(again) == expected and again.stats.fallbacks == {}
    assert victim.read_bytes() == original


@pytest.mark.parametrize("workers,mode", MODES)
def test_untampered_records_are_served_without_a_rebuild(
        dataset: Manifest, expected: list[dict[str, Any]], tmp_path: Path, workers: int,
        mode: str) -> None:
    _stored(dataset, tmp_path)
    before = {f: (f.stat().st_ino, f.stat().st_mtime_ns, f.read_bytes())
              for f in tmp_path.glob("*.rec")}
    dl = _loader(dataset, tmp_path, workers, mode, row_major="auto")
    assert _batches(dl) == expected
    assert dl.stats.fallbacks == {}
    after = {f: (f.stat().st_ino, f.stat().st_mtime_ns, f.read_bytes())
             for f in tmp_path.glob("*.rec")}
    # the same files (same inodes, not rewritten); mapping them only touches their mtime
    assert {f: (i, b) for f, (i, _, b) in after.items()} == \
        {f: (i, b) for f, (i, _, b) in before.items()}


def test_a_tamper_in_the_middle_is_caught_when_the_sample_holds_its_row(
        dataset: Manifest, expected: list[dict[str, Any]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    _stored(dataset, tmp_path)
    victim, layout = _file(dataset, tmp_path, 0)
    original = _tamper(victim, layout, row=150)
    tampered = victim.read_bytes()
    # only the first and last rows checked: row 150 is served as stored (what a sampled check
    # cannot promise to catch; the audit with --dataset does, tests/audit)
    monkeypatch.setattr(record_check, "SAMPLE_ROWS", 0)
    blind = _loader(dataset, tmp_path)
    served = _batches(blind)
    assert blind.stats.fallbacks == {}
    assert served != expected and [i for i, (a, b) in enumerate(zip(served, expected))
                                   if a != b] == [150 // 16]
    assert victim.read_bytes() == tampered
    # a sample that holds row 150 (here: every row of the shard) catches it
    monkeypatch.setattr(record_check, "SAMPLE_ROWS", SIZES[0])
    dl = _loader(dataset, tmp_path)
    assert _batches(dl) == expected
    assert dl.stats.fallbacks == {"records_mismatch": 1}
    assert victim.read_bytes() == original


def test_first_mismatch_names_the_checked_row_and_output(dataset: Manifest) -> None:
    _, data, layout = _shard(dataset, 0)
    records = np.array(rowmajor.build(layout, data))
    assert record_check.first_mismatch(layout, data, records, rows=np.arange(SIZES[0])) is None
    seq = next(f for f in layout.fields if f.name == "seq")
    records[150, seq.offset + 5] ^= 0x01  # one bit of one list value
    assert record_check.first_mismatch(layout, data, records, rows=np.array([0, 299])) is None
    assert record_check.first_mismatch(layout, data, records, rows=np.array([0, 150, 299])) == \
        record_check.Mismatch(150, "seq")
    # a field the shard's records do not hold (a misfit) is not compared
    assert record_check.first_mismatch(layout, data, records, skip=["seq"],
                                       rows=np.arange(SIZES[0])) is None
    pad = layout.stride - 1  # padding after the last field is never served: not compared
    if all(f.offset + f.nbytes <= pad for f in layout.fields):
        records[10, pad] ^= 0xFF
        assert record_check.first_mismatch(layout, data, records, skip=["seq"],
                                           rows=np.arange(SIZES[0])) is None


@pytest.mark.parametrize("values", [[1.0, 2.0], [1.0, 2.0, 0.0, 4.0], None],
                         ids=["shorter", "longer", "null"])
def test_a_list_of_another_length_is_a_mismatch(tmp_path: Path, values: Any) -> None:
    """Records are named for a shard's bytes and the layout without misfits, and a process
    that finds such a file trusts that its shard has none (its list offsets are not read
    again): a shard whose list at a checked row has another length, or is null, differs
    from every record, even where its values padded with zeros would match."""
    table = record_table(40, 0, 7)
    seq = table.column("seq").to_pylist()
    seq[9] = [1.0, 2.0, 0.0]  # what the records hold: the shorter list padded
    even = write_dataset(tmp_path / "even", [table.set_column(4, "seq", pa.array(
        seq, pa.list_(pa.float32())))], batch_rows=32)
    seq[9] = values
    ragged = write_dataset(tmp_path / "ragged", [table.set_column(4, "seq", pa.array(
        seq, pa.list_(pa.float32())))], batch_rows=32)
    _, data, layout = _shard(even, 0)
    records = np.array(rowmajor.build(layout, data))
    _, other, _ = _shard(ragged, 0)
    rows = np.arange(40)
    assert record_check.first_mismatch(layout, data, records, rows=rows) is None
    assert record_check.first_mismatch(layout, other, records, rows=rows) == \
        record_check.Mismatch(9, "seq")


def test_sample_rows_first_last_and_fresh_random_rows() -> None:
    small = record_check.sample_rows(50, 64)
    assert small.tolist() == list(range(50))  # a small shard: every row
    draws = [record_check.sample_rows(100_000, 64) for _ in range(2)]
    for rows in draws:
        assert len(rows) == 66 and rows[0] == 0 and rows[-1] == 99_999
        assert (np.diff(rows) > 0).all()  # sorted, distinct
    assert draws[0].tolist() != draws[1].tolist()  # drawn afresh, from the OS's entropy
    assert record_check.sample_rows(100_000, 0).tolist() == [0, 99_999]


def test_a_foreign_file_found_when_saving_is_checked_before_it_replaces_built_records(
        dataset: Manifest, tmp_path: Path) -> None:
    """Another process published records while this one built its own: they are compared
    with the shard before this process serves them instead of its own."""
    _stored(dataset, tmp_path)
    victim, layout = _file(dataset, tmp_path, 1)
    original = victim.read_bytes()
    src = ArrowSource(dataset, columns=[*FEATS, *CATS, *COLUMNS], features=FEATS,
                      categoricals=CATS, row_major=True, row_major_dir=str(tmp_path))
    ids = np.arange(SIZES[0], SIZES[0] + SIZES[1])
    src.fetch(ids)  # shard 1 opens and maps the good file
    rm = src._rm
    built = np.array(rowmajor.build(rm.table.layout, src._data_of(1)))
    _tamper(victim, layout, row=3)  # a foreign, wrong file now sits under the name
    with collecting() as noted:
        rm._save(rm._store, victim.name, 1, src._data_of(1), built, [])
    assert noted["records_mismatch"][0] == 1 and "shard 1" in noted["records_mismatch"][1]
    assert victim.read_bytes() == original  # deleted, then this process's records saved
    src.close()



def test_sample_block_is_the_ends_and_one_fresh_run() -> None:
    """Past memory a scattered row costs a read per column: the block is one run between the
    ends, at an offset that changes from draw to draw."""
    starts = set()
    for _ in range(20):
        rows = record_check.sample_block(1_000_000, 64)
        inner = rows[1:-1]
        assert rows[0] == 0 and rows[-1] == 999_999 and len(inner) == 64
        assert np.array_equal(np.diff(inner), np.ones(63, dtype=np.int64))
        starts.add(int(inner[0]))
    assert len(starts) > 15
    assert np.array_equal(record_check.sample_block(50, 64), np.arange(50))
