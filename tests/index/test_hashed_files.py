"""Indexed files hashed right on this node are not hashed again while ``stat`` says they are
unchanged (stoker.loader.read.indexed.hashed_files); a file changed in place is hashed again
and refused; without a records directory every source hashes."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stoker.loader.errors import WorkerError
from stoker.loader.read.indexed import hashed_files
from stoker.loader.read.indexed import source as index_source
from stoker.loader.read.indexed.source import IndexSource
from stoker.manifest import Manifest, ShardIntegrityError
from stoker.tools.cli import main


@pytest.fixture()
def indexed(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    x = np.arange(300, dtype=np.int64)
    pq.write_table(pa.table({"x": x, "y": x.astype(np.float32)}), root / "a.parquet",
                   row_group_size=100)
    assert main(["index", str(root), "--quiet"]) == 0
    return root


def _boom(path: object) -> None:
    raise AssertionError(f"{path} was hashed again")


def _read(root: Path, records: Path | None) -> list[int]:
    src = IndexSource(Manifest.load(root), row_major_dir=None if records is None
                      else str(records))
    try:
        return src.take(np.arange(120, 130)).column("x").to_pylist()
    finally:
        src.close()


def test_an_unchanged_file_is_hashed_once_per_node(indexed: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hashed_files, "_SETTLED_NS", 0)
    records = tmp_path / "records"
    assert _read(indexed, records) == list(range(120, 130))
    assert len(list(records.glob("*.ok"))) == 1
    real = index_source.hash_file
    monkeypatch.setattr(index_source, "hash_file", _boom)
    assert _read(indexed, records) == list(range(120, 130))  # a later process: no hash
    time.sleep(0.05)  # past the file clock's granularity: the rewrite gets new times
    target = indexed / "a.parquet"
    data = bytearray(target.read_bytes())
    data[200] ^= 0xFF  # same size, in place
    target.write_bytes(bytes(data))
    with pytest.raises(WorkerError, match="hashed again"):
        _read(indexed, records)
    monkeypatch.setattr(index_source, "hash_file", real)
    with pytest.raises(ShardIntegrityError, match=r"a\.parquet: file changed after it was indexed"):
        _read(indexed, records)


def test_a_note_with_other_times_is_not_trusted(indexed: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hashed_files, "_SETTLED_NS", 0)
    records = tmp_path / "records"
    _read(indexed, records)
    (note,) = records.glob("*.ok")
    dev, ino, size, mtime, ctime = note.read_text().split()
    note.write_text(" ".join([dev, ino, size, mtime, str(int(ctime) - 1)]))
    monkeypatch.setattr(index_source, "hash_file", _boom)
    with pytest.raises(WorkerError, match="hashed again"):
        _read(indexed, records)


def test_a_file_changed_just_now_or_no_records_directory_is_hashed_every_time(
        indexed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records = tmp_path / "records"
    _read(indexed, records)  # written under 2 s ago: its times may not tell a rewrite apart
    assert list(records.glob("*.ok")) == []
    monkeypatch.setattr(hashed_files, "_SETTLED_NS", 0)
    _read(indexed, None)
    monkeypatch.setattr(index_source, "hash_file", _boom)
    with pytest.raises(WorkerError, match="hashed again"):
        _read(indexed, None)
