"""Named fallbacks are counted, written to the ledger and logged once; nothing else is taken.

A zstd-compressed dataset cannot be read zero-copy, so every batch takes the pyarrow path:
that must show in ``loader.stats.fallbacks`` (one per batch, also from worker processes), as
one ``"fallback"`` ledger event naming the reason plus the epoch's counts, and as one log
line. (The silent ``except Exception: pass`` this replaces left no trace at all; the
library-wide ban on such handlers is tests/layering/test_no_silent_except.py.)
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from loader_helpers import make_dataset

from stoker.loader import DataLoader, WorkerOptions
from stoker.loader.ledger.writer import read_ledger


@pytest.fixture(scope="module")
def zstd_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("zstd")
    make_dataset(root, [40, 35, 50], compression="zstd")
    return root


@pytest.mark.parametrize("workers,mode", [(0, "thread"), (2, "thread"), (2, "process")])
def test_compressed_shards_are_a_counted_logged_recorded_fallback(
        zstd_dataset: Path, tmp_path: Path, workers: int, mode: str, caplog) -> None:
    ledger = tmp_path / "run.ledger"
    dl = DataLoader(zstd_dataset, batch_size=10, shuffle=True, seed=3, num_workers=workers,
                    ledger=ledger, workers=WorkerOptions(mode=mode))
    with caplog.at_level(logging.WARNING, logger="stoker.loader"):
        batches = len(list(dl))
    dl.close()
    assert batches == 13
    assert dl.stats.fallbacks == {"not_zero_copy": 13}
    assert dl.stats.as_dict()["fallbacks"] == {"not_zero_copy": 13}
    lines = [r for r in caplog.records if "not_zero_copy" in r.getMessage()]
    assert len(lines) == 1 and "shard" in lines[0].getMessage()
    events = read_ledger(ledger).events
    first = [e for e in events if e["kind"] == "fallback"]
    assert len(first) == 1 and first[0]["reason"] == "not_zero_copy"
    assert (first[0]["epoch"], first[0]["step"]) == (0, 0) and "shard" in first[0]["detail"]
    (counts,) = [e for e in events if e["kind"] == "fallback_counts"]
    assert counts["counts"] == {"not_zero_copy": 13}


def test_uncompressed_shards_take_no_fallback(tmp_path: Path) -> None:
    make_dataset(tmp_path / "d", [40, 35, 50])
    dl = DataLoader(tmp_path / "d", batch_size=10, shuffle=True, seed=3,
                    ledger=tmp_path / "run.ledger")
    assert len(list(dl)) == 13
    dl.close()
    assert dl.stats.fallbacks == {}
    assert not [e for e in read_ledger(tmp_path / "run.ledger").events
                if e["kind"].startswith("fallback")]


def test_an_unreadable_shard_is_a_typed_error_naming_it_not_a_slow_path(tmp_path: Path) -> None:
    from stoker.loader.errors import WorkerError

    make_dataset(tmp_path / "d", [40, 35])
    shard = tmp_path / "d" / "shards" / "00001.arrow"
    shard.write_bytes(b"\xff" * shard.stat().st_size)  # same size: passes the cheap check
    dl = DataLoader(tmp_path / "d", batch_size=75)
    with pytest.raises(WorkerError, match=r"shard 1 .*00001\.arrow"):
        next(iter(dl))
    dl.close()
    assert dl.stats.fallbacks == {}
