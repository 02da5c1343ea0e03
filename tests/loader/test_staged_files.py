"""Stored records for staged rounds (stoker.loader.read.staged_files): a dataset past memory
builds its shards' records in the background, later rounds copy runs from those files, and
every batch is the bytes the columns give; records that differ from the shard are never
served."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from stoker.loader import DataLoader, ReadOptions, ShuffleOptions
from stoker.loader.fastpath.record_store import RecordStore
from stoker.sharder import shard
from stoker.sharder.synthetic import make_tabular_table

FEATURES = [f"f{i}" for i in range(8)]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("staged-files")
    pq.write_table(make_tabular_table(4000, seed=5), root / "in.parquet", row_group_size=500)
    shard(str(root / "in.parquet"), str(root / "ds"), rows_per_shard=1000, progress=False)
    return root / "ds"


@pytest.fixture()
def past_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shards do not fit this node's memory (as 20 M W1 rows in a 6 GiB cgroup)."""
    import stoker.loader.read.arrow as arrow

    monkeypatch.setattr(arrow, "shards_fit_memory", lambda *a, **k: False)


def _epochs(dataset: Path, records: object, epochs: int = 2) -> tuple[list[dict], DataLoader]:
    dl = DataLoader(str(dataset), batch_size=64, seed=3, columns=["seq", "label"],
                    shuffle=ShuffleOptions(partitions=4, block_size=128),
                    read=ReadOptions(features=FEATURES, row_major="staged",
                                     records_dir=records))
    out = []
    for e in range(epochs):
        dl.set_epoch(e)
        out += [{k: v.clone() for k, v in b.items()} for b in dl]
    dl._source.wait_row_major()
    return out, dl


def _same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert list(x) == list(y)
        for k in x:
            assert x[k].dtype == y[k].dtype and x[k].numpy().tobytes() == y[k].numpy().tobytes()


def test_rounds_copy_from_stored_records_once_built(dataset: Path, tmp_path: Path,
                                                    past_memory: None) -> None:
    columns, dl = _epochs(dataset, False)
    assert dl._source._files is None  # no records directory: the columns only
    dl.close()
    first, dl = _epochs(dataset, tmp_path)
    files = dl._source._files
    assert files is not None and files.built == 4  # every shard, in the background
    dl.close()
    assert len(list(tmp_path.glob("*.rec"))) == 4
    later, dl = _epochs(dataset, tmp_path)
    files = dl._source._files
    assert files.built == 0 and files.runs_from_files > 0
    assert not dl.stats.fallbacks
    dl.close()
    assert len(list(tmp_path.glob("*.rec.ok"))) == 4  # hashed right: later processes map them
    _same(first, columns)
    _same(later, columns)


def test_records_that_differ_from_the_shard_are_not_served(dataset: Path, tmp_path: Path,
                                                           past_memory: None) -> None:
    columns, dl = _epochs(dataset, False)
    dl.close()
    _, dl = _epochs(dataset, tmp_path)
    dl.close()
    store = RecordStore(str(tmp_path))
    name = sorted(p.name for p in tmp_path.glob("*.rec"))[0]
    nbytes = (tmp_path / name).stat().st_size - 16
    records = np.fromfile(tmp_path / name, dtype=np.uint8)[:nbytes]  # a valid file ...
    records ^= 1  # ... of other bytes (checksum and all)
    store.discard(name)
    assert store.save(name, records)
    got, dl = _epochs(dataset, tmp_path)
    assert dl.stats.fallbacks.get("records_mismatch") == 1
    dl.close()
    _same(got, columns)
    # the rebuilt file holds the shard's records again
    assert not np.array_equal(np.fromfile(tmp_path / name, dtype=np.uint8)[:nbytes], records)


def test_in_memory_datasets_build_no_files(dataset: Path, tmp_path: Path) -> None:
    _, dl = _epochs(dataset, tmp_path, 1)
    assert dl._source.stager is not None and dl._source._files is None
    dl.close()
    assert not list(tmp_path.glob("*.rec"))


def test_records_larger_than_the_directory_limit_are_not_built(
        dataset: Path, tmp_path: Path, past_memory: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Files that cannot all be kept would evict one another every epoch: none are built,
    and the loader says so."""
    import functools

    from stoker.loader.fastpath import shard_records

    monkeypatch.setattr(shard_records, "RecordStore", functools.partial(RecordStore, limit=4096))
    columns, dl = _epochs(dataset, False)
    dl.close()
    got, dl = _epochs(dataset, tmp_path)
    assert dl._source._files is None and dl.stats.fallbacks.get("records_not_saved") == 1
    dl.close()
    assert not list(tmp_path.glob("*.rec"))
    _same(got, columns)


def test_a_note_of_records_written_holds_in_their_boot(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A file this node wrote is read unhashed until the machine restarts (the page cache
    serves what was written); one that hashed right, in any boot; another file under the
    same name (a new inode or size), never."""
    from stoker.loader.read import staged_files

    path = tmp_path / "a.rec"
    path.write_bytes(b"x" * 32)
    assert not staged_files.hashed_before(str(path))
    staged_files.note_written(str(path))
    assert staged_files.hashed_before(str(path))
    monkeypatch.setattr(staged_files, "_boot", lambda: "a later boot")
    assert not staged_files.hashed_before(str(path))  # restarted since: hashed again
    staged_files.note_hashed(str(path))
    assert staged_files.hashed_before(str(path))
    monkeypatch.undo()
    assert staged_files.hashed_before(str(path))
    other = tmp_path / "b.rec"
    other.write_bytes(b"y" * 33)
    other.replace(path)  # a new file under the name
    assert not staged_files.hashed_before(str(path))
