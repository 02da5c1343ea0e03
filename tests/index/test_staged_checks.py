"""Staged reads of indexed Parquet (rounds from decoded row groups) check each row group's
bytes (or, indexed without row-group digests, the file's hash) before its rows are handed
out: the error names the file, and no row of a changed group is handed out. Here every row
group is decoded for the first round, so a changed file hands out no batch at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from stoker.loader import DataLoader, ReadOptions
from stoker.manifest import ShardIntegrityError

from staged_index import CATS, FEATS, indexed  # noqa: F401 - a fixture


def _loader(root: Path) -> DataLoader:
    return DataLoader(str(root), batch_size=16, shuffle=True, seed=3, columns=["seq", "label"],
                      read=ReadOptions(features=FEATS, categoricals=CATS, records_dir=False))


@pytest.mark.parametrize("where", [0.25, 0.5, 0.75])
def test_a_file_changed_after_indexing_hands_out_no_batch(indexed: Path, where: float) -> None:
    path = indexed / "b.parquet"
    raw = bytearray(path.read_bytes())
    raw[int(len(raw) * where)] ^= 0x10  # same size: only the hash can tell
    path.write_bytes(bytes(raw))
    loader = _loader(indexed)
    assert loader._source._stager is not None  # the staged path
    got = []
    with pytest.raises(ShardIntegrityError, match="b.parquet: file changed after it was indexed"):
        for batch in loader:
            got.append(batch)
    assert got == []

