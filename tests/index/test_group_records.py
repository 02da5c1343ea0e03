"""Indexed Parquet row groups' records kept on the node
(stoker.loader.read.indexed.group_records): a later run maps them instead of decoding, serves
the same bytes, and never serves records that differ from the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import xxhash

from stoker.loader import DataLoader, ReadOptions
from stoker.loader.read.indexed import group_records, natural

from staged_index import CATS, FEATS, indexed  # noqa: F401 - a fixture


@pytest.fixture(params=["in memory", "past memory"])
def memory(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Past memory (files larger than the node's memory) stored records are read, not mapped,
    hashed once per node and checked at a run of rows."""
    if request.param == "past memory":
        from stoker.loader.read.indexed import source

        monkeypatch.setattr(source, "shards_fit_memory", lambda *a, **k: False)
    return request.param


def _loader(root: Path, where: Any) -> DataLoader:
    return DataLoader(str(root), batch_size=16, shuffle=True, seed=3, columns=["seq", "label"],
                      read=ReadOptions(features=FEATS, categoricals=CATS, records_dir=where))


def _epoch(loader: DataLoader) -> list[dict[str, bytes]]:
    out = [{k: v.numpy().tobytes() for k, v in b.items()} for b in loader]
    loader._source.wait_row_major()
    return out


def _rewrite_with_checksum(where: Path) -> None:
    """Flip a bit of every stored file's first record's f2 (f0, f1, f2: 4 bytes each) and
    write its checksum anew: the store's own check passes such a file."""
    for path in where.glob("*.rec"):
        body = bytearray(path.read_bytes())[:-16]
        body[8] ^= 0x01
        path.write_bytes(bytes(body) + xxhash.xxh3_128_digest(bytes(body)))


def test_a_later_run_maps_every_group_and_serves_the_same_bytes(indexed: Path, tmp_path: Path,
                                                                 memory: str) -> None:
    want = _epoch(_loader(indexed, False))
    where = tmp_path / "records"
    first = _loader(indexed, where)
    assert _epoch(first) == want
    groups = 4 + 3  # 130 and 90 rows in groups of 40
    assert first._source._row_groups.decoded == groups
    assert len(list(where.glob("*.rec"))) == groups
    later = _loader(indexed, where)
    assert _epoch(later) == want
    row_groups = later._source._row_groups
    assert row_groups.decoded == 1  # the first group read fixes the record layout
    assert row_groups.stored.mapped == groups - 1
    if memory == "past memory":  # written in this boot: later processes read them unhashed
        assert len(list(where.glob("*.rec.ok"))) == groups
        again = _loader(indexed, where)
        assert _epoch(again) == want and again._source._row_groups.stored.mapped == groups - 1


def test_stored_records_that_differ_from_the_file_are_never_served(
        indexed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog,
        memory: str) -> None:
    """Records rewritten together with their checksum pass the store's own check; the
    comparison with the file's columns finds them, the file is deleted and rebuilt."""
    monkeypatch.setattr(group_records, "CHECKED_COLUMNS", 100)  # every column
    want = _epoch(_loader(indexed, False))
    where = tmp_path / "records"
    _epoch(_loader(indexed, where))
    _rewrite_with_checksum(where)
    later = _loader(indexed, where)
    assert _epoch(later) == want
    assert later.stats.fallbacks["records_mismatch"] == 7 - 1  # the layout's group: decoded
    assert "differ from the file in column 'f2'" in caplog.text
    assert later._source._row_groups.stored.mapped == 0
    again = _loader(indexed, where)  # saved again, right this time
    assert _epoch(again) == want and again._source._row_groups.stored.mapped == 6


def test_without_a_records_directory_nothing_is_kept(indexed: Path) -> None:
    loader = _loader(indexed, False)
    _epoch(loader)
    assert loader._source._row_groups.stored is None


def test_saves_waiting_for_the_disk_are_bounded(indexed: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Each waiting save holds its group's records in memory: past the bound a group is not
    saved (counted) and a later run saves it; no batch changes either way."""
    monkeypatch.setattr(group_records, "_PENDING", 0)
    want = _epoch(_loader(indexed, False))
    where = tmp_path / "records"
    first = _loader(indexed, where)
    assert _epoch(first) == want
    assert first.stats.fallbacks["records_not_saved"] == 7 and not list(where.glob("*.rec"))
    monkeypatch.setattr(group_records, "_PENDING", 8)
    assert _epoch(_loader(indexed, where)) == want
    assert len(list(where.glob("*.rec"))) == 7


def _natural(root: Path, where: Any) -> DataLoader:
    return DataLoader(str(root), batch_size=16, shuffle=False, columns=["seq", "label"],
                      read=ReadOptions(features=FEATS, categoricals=CATS, records_dir=where))


def test_natural_order_reads_the_stored_groups_shuffled_runs_share(indexed: Path,
                                                                   tmp_path: Path,
                                                                   memory: str) -> None:
    """Unshuffled runs save the groups they decode and a later run reads them instead of
    decoding (the first group read fixes the layout); shuffled and natural runs share the
    files; the batches are the bytes of a run that keeps no records."""
    want = _epoch(_natural(indexed, False))
    groups = 4 + 3
    where = tmp_path / "records"
    first = _natural(indexed, where)
    assert _epoch(first) == want
    assert first._source._natural.decoded == groups
    assert len(list(where.glob("*.rec"))) == groups
    later = _natural(indexed, where)
    assert _epoch(later) == want
    assert later._source._natural.decoded == 1
    assert later._source._natural.stored.mapped == groups - 1
    assert len(later._source._natural._kept) <= natural._KEPT  # groups read go
    shuffled = _loader(indexed, where)  # the same files serve shuffled rounds
    assert _epoch(shuffled) == _epoch(_loader(indexed, False))
    assert shuffled._source._row_groups.stored.mapped == groups - 1
    assert len(list(where.glob("*.rec"))) == groups


def test_natural_order_opens_each_stored_group_once_whatever_the_budget(
        indexed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memory: str) -> None:
    """Past its byte budget a natural-order reader drops the groups behind the one batches
    read, never that one nor those loaded ahead of it: plain LRU dropped the group being read
    when a group loaded ahead went over, and it was opened (hashed, checked) again."""
    want = _epoch(_natural(indexed, False))
    where = tmp_path / "records"
    _epoch(_natural(indexed, where))
    real = natural.NaturalGroups.__init__

    def tiny(self: Any, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        self._budget = 1  # below one group's records

    monkeypatch.setattr(natural.NaturalGroups, "__init__", tiny)
    later = _natural(indexed, where)
    assert _epoch(later) == want
    assert later._source._natural.stored.mapped == 7 - 1  # each once; one group decoded
    assert len(later._source._natural._kept) <= 1 + natural._AHEAD
    assert _epoch(later) == want  # the next epoch starts behind the last group read
    assert later._source._natural.stored.mapped <= 2 * 7 - 1  # once each again, at most


def test_natural_order_never_serves_stored_records_that_differ(
        indexed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(group_records, "CHECKED_COLUMNS", 100)  # every column
    want = _epoch(_natural(indexed, False))
    where = tmp_path / "records"
    _epoch(_natural(indexed, where))
    _rewrite_with_checksum(where)
    later = _natural(indexed, where)
    assert _epoch(later) == want
    assert later.stats.fallbacks["records_mismatch"] == 7 - 1
    assert later._source._natural.stored.mapped == 0
