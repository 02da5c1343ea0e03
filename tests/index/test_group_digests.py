"""``stoker index`` records each Parquet row group's bytes and the footer's
(``extra.digests``, hashed in the file's one read), and the loader checks each group just
before its first decode: a changed group is refused by name while the file's other groups
are still read, with threads and process workers alike."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.loader import DataLoader, WorkerOptions
from stoker.manifest import (Manifest, ShardIntegrityError, compute_fingerprint, hash_file,
                             hash_file_ranges)
from stoker.tools.cli import main


@pytest.fixture()
def indexed(tmp_path: Path) -> Path:
    """600 rows of ``x``, ``y``, ``s`` in row groups of 100 (dictionary pages for ``s``)."""
    root = tmp_path / "data"
    root.mkdir()
    x = np.arange(600, dtype=np.int64)
    pq.write_table(pa.table({"x": x, "y": (x * 0.5).astype(np.float32),
                             "s": [f"v{i % 7}" for i in x]}), root / "a.parquet",
                   row_group_size=100)
    assert main(["index", str(root), "--quiet"]) == 0
    return root


def test_each_row_group_and_the_footer_are_digested_as_their_bytes(indexed: Path) -> None:
    raw = (indexed / "a.parquet").read_bytes()
    digests = Manifest.load(indexed).shards[0].extra["digests"]
    groups, (f_lo, f_hi, f_digest) = digests["row_groups"], digests["footer"]
    assert len(groups) == 6
    assert (f_hi, f_lo) == (len(raw), len(raw) - 8 - int.from_bytes(raw[-8:-4], "little"))
    assert f_digest == xxhash.xxh3_128_hexdigest(raw[f_lo:f_hi])
    meta = pq.read_metadata(indexed / "a.parquet")
    for g, (lo, hi, digest) in enumerate(groups):
        chunks = [meta.row_group(g).column(c) for c in range(meta.num_columns)]
        starts = [min(c.data_page_offset, c.dictionary_page_offset or c.data_page_offset)
                  for c in chunks]
        assert lo == min(starts)
        assert hi == max(s + c.total_compressed_size for s, c in zip(starts, chunks))
        assert digest == xxhash.xxh3_128_hexdigest(raw[lo:hi])
    assert [hi for _, hi, _ in groups[:-1]] == [lo for lo, _, _ in groups[1:]]  # adjacent
    assert groups[0][0] == 4 and groups[-1][1] <= f_lo


@settings(max_examples=60, deadline=None)
@given(data=st.binary(min_size=0, max_size=5000),
       cuts=st.lists(st.integers(0, 5000), max_size=12))
def test_ranges_hashed_in_the_files_one_read_are_their_slices(tmp_path_factory, data: bytes,
                                                              cuts: list[int]) -> None:
    path = tmp_path_factory.mktemp("h") / "f"
    path.write_bytes(data)
    points = sorted({min(c, len(data)) for c in cuts})
    ranges = [(a, b) for a, b in zip(points[::2], points[1::2])]  # sorted, disjoint, gaps
    digest, size, parts = hash_file_ranges(path, ranges)
    assert (digest, size) == hash_file(path)
    assert parts == [xxhash.xxh3_128_hexdigest(data[a:b]) for a, b in ranges]


def test_ranges_that_overlap_or_pass_the_end_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    with pytest.raises(ValueError, match=r"sorted and disjoint: \[0, 50\) then \[40"):
        hash_file_ranges(path, [(0, 50), (40, 60)])
    with pytest.raises(ValueError, match="past the end"):
        hash_file_ranges(path, [(0, 50), (60, 101)])


def _flip_group(root: Path, group: int) -> None:
    lo, hi, _ = Manifest.load(root).shards[0].extra["digests"]["row_groups"][group]
    path = root / "a.parquet"
    raw = bytearray(path.read_bytes())
    raw[(lo + hi) // 2] ^= 0x01  # same size, inside the group's column chunks
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("mode,workers", [("thread", 0), ("thread", 2), ("process", 2)])
@pytest.mark.parametrize("columns", [["x", "s"], ["x", "y"]])  # pyarrow; records (natural)
def test_a_changed_row_group_is_refused_by_name_and_none_of_its_rows_is_served(
        indexed: Path, mode: str, workers: int, columns: list[str]) -> None:
    _flip_group(indexed, 4)  # rows 400-499
    loader = DataLoader(str(indexed), batch_size=50, shuffle=False, columns=columns,
                        num_workers=workers, workers=WorkerOptions(mode=mode))
    seen: list[int] = []
    with pytest.raises(ShardIntegrityError, match=r"a\.parquet: file changed after it was "
                       r"indexed \(xxh3-128 [0-9a-f]{32} of row group 4, bytes"):
        for batch in loader:
            seen += batch["x"].tolist()
    assert seen == list(range(400))  # in order up to the changed group, nothing of it


def test_an_index_without_digests_still_checks_the_whole_file(indexed: Path) -> None:
    """An index written before row-group digests (or of a file whose offsets do not give
    disjoint ranges) hashes the whole file before its first read, as it did."""
    _flip_group(indexed, 4)
    doc = json.loads((indexed / "manifest.json").read_text())
    del doc["shards"][0]["extra"]["digests"]
    doc["fingerprint"] = compute_fingerprint(doc)
    (indexed / "manifest.json").write_text(json.dumps(doc))
    loader = DataLoader(str(indexed), batch_size=50, shuffle=False, columns=["x"])
    seen: list[int] = []
    with pytest.raises(ShardIntegrityError, match=r"a\.parquet: file changed after it was "
                       r"indexed \(xxh3-128 [0-9a-f]{32}, indexed"):
        for batch in loader:
            seen += batch["x"].tolist()
    assert seen == []
