"""Indexed files checked right on this node are not checked again while ``stat`` says they
are unchanged (stoker.loader.read.indexed.hashed_files); a file changed in place is checked
again and refused; without a records directory every source checks. Both ways of checking:
Parquet indexed with row-group digests (the footer, then each row group as it is first
read) and files hashed whole (indexes written before the digests, tars)."""

from __future__ import annotations

import json
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
from stoker.manifest import Manifest, ShardIntegrityError, compute_fingerprint
from stoker.tools.cli import main


@pytest.fixture(params=["row groups", "whole"])
def indexed(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """300 rows in row groups of 100; "whole": the index as written before row-group
    digests (no ``extra.digests``, fingerprint recomputed)."""
    root = tmp_path / "data"
    root.mkdir()
    x = np.arange(300, dtype=np.int64)
    pq.write_table(pa.table({"x": x, "y": x.astype(np.float32)}), root / "a.parquet",
                   row_group_size=100)
    assert main(["index", str(root), "--quiet"]) == 0
    if request.param == "whole":
        doc = json.loads((root / "manifest.json").read_text())
        del doc["shards"][0]["extra"]["digests"]
        doc["fingerprint"] = compute_fingerprint(doc)
        (root / "manifest.json").write_text(json.dumps(doc))
    return root


def _whole(root: Path) -> bool:
    return "digests" not in Manifest.load(root).shards[0].extra


def _boom(*args: object) -> None:
    raise AssertionError(f"{args} was hashed again")


def _no_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index_source, "hash_file", _boom)
    monkeypatch.setattr(index_source, "hash_range", _boom)


def _read(root: Path, records: Path | None, rows: range = range(120, 130)) -> list[int]:
    src = IndexSource(Manifest.load(root), row_major_dir=None if records is None
                      else str(records))
    try:
        return src.take(np.asarray(rows)).column("x").to_pylist()
    finally:
        src.close()


def _flip(path: Path, at: int) -> None:
    time.sleep(0.05)  # past the file clock's granularity: the rewrite gets new times
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF  # same size, in place
    path.write_bytes(bytes(data))


def test_an_unchanged_file_is_hashed_once_per_node(indexed: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hashed_files, "_SETTLED_NS", 0)
    records = tmp_path / "records"
    assert _read(indexed, records) == list(range(120, 130))
    # a note for the file, or for its footer and the row group read (and maybe the next,
    # checked ahead)
    info, path = Manifest.load(indexed).shards[0], str(indexed / "a.parquet")
    noted = [info.xxh3_128] if _whole(indexed) else \
        [info.extra["digests"]["footer"][2], info.extra["digests"]["row_groups"][1][2]]
    notes = hashed_files.HashedFiles(str(records))
    assert all(notes.known(path, d, (indexed / "a.parquet").stat()) for d in noted)
    assert len(list(records.glob("*.ok"))) in ((1,) if _whole(indexed) else (2, 3))
    real = index_source.hash_file, index_source.hash_range
    _no_hashing(monkeypatch)
    assert _read(indexed, records) == list(range(120, 130))  # a later process: no hash
    _flip(indexed / "a.parquet", 200)  # inside row group 0
    with pytest.raises(WorkerError, match="hashed again"):
        _read(indexed, records)
    monkeypatch.setattr(index_source, "hash_file", real[0])
    monkeypatch.setattr(index_source, "hash_range", real[1])
    if _whole(indexed):
        with pytest.raises(ShardIntegrityError,
                           match=r"a\.parquet: file changed after it was indexed"):
            _read(indexed, records)
        return
    # checked by row group: rows of the other groups are still served, group 0's are not
    assert _read(indexed, records) == list(range(120, 130))
    assert _read(indexed, records, range(200, 210)) == list(range(200, 210))
    with pytest.raises(ShardIntegrityError, match=r"a\.parquet: file changed after it was "
                       r"indexed \(xxh3-128 [0-9a-f]{32} of row group 0, bytes \[4, \d+\), "
                       r"indexed [0-9a-f]{32}\)"):
        _read(indexed, records, range(0, 10))


def test_a_changed_footer_is_refused_before_any_row_is_read(indexed: Path) -> None:
    size = (indexed / "a.parquet").stat().st_size
    _flip(indexed / "a.parquet", size - 30)  # inside the footer's metadata
    what = "" if _whole(indexed) else " of its footer"
    with pytest.raises(ShardIntegrityError, match=r"a\.parquet: file changed after it was "
                       rf"indexed \(xxh3-128 [0-9a-f]{{32}}{what}"):
        _read(indexed, None)
    if not _whole(indexed):
        start, end, _ = Manifest.load(indexed).shards[0].extra["digests"]["footer"]
        assert start < size - 30 and end == size


def test_a_note_with_other_times_is_not_trusted(indexed: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hashed_files, "_SETTLED_NS", 0)
    records = tmp_path / "records"
    _read(indexed, records)
    for note in records.glob("*.ok"):
        dev, ino, size, mtime, ctime = note.read_text().split()
        note.write_text(" ".join([dev, ino, size, mtime, str(int(ctime) - 1)]))
    _no_hashing(monkeypatch)
    with pytest.raises(WorkerError, match="hashed again"):
        _read(indexed, records)


def test_a_file_changed_just_now_or_no_records_directory_is_hashed_every_time(
        indexed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records = tmp_path / "records"
    _read(indexed, records)  # written under 2 s ago: its times may not tell a rewrite apart
    assert list(records.glob("*.ok")) == []
    monkeypatch.setattr(hashed_files, "_SETTLED_NS", 0)
    _read(indexed, None)
    _no_hashing(monkeypatch)
    with pytest.raises(WorkerError, match="hashed again"):
        _read(indexed, None)
