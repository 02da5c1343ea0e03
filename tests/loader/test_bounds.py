"""Row indices that reach raw-pointer reads are in range (issue 14, hole 4).

A manifest's record-batch row counts are what global ids are located with; the kernels then
read through raw pointers. Hypothesis rewrites one shard's counts in the manifest (the
fingerprint recomputed, so the manifest itself is valid) and reads every id the manifest
promises, through the kernels, the row-major records and pyarrow: each read must raise a
typed ``ShardIntegrityError`` naming the shard, never crash or return rows from outside it.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loader_helpers import make_dataset

from stoker.loader import DataLoader, ReadOptions
from stoker.loader.read.arrow import ArrowSource
from stoker.manifest import Manifest, ShardIntegrityError, compute_fingerprint
from stoker.manifest.manifest import encode_runs

ROWS = [30, 25, 41]
BATCH_ROWS = 8


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bounds")
    make_dataset(root, ROWS, batch_rows=BATCH_ROWS)
    return root


def _corrupt(root: Path, shard: int, batch_rows: list[int]) -> Manifest:
    doc = json.loads((root / "manifest.json").read_text())
    doc["shards"][shard]["batches"] = encode_runs(batch_rows)
    doc["shards"][shard]["rows"] = sum(batch_rows)
    doc["num_samples"] = sum(s["rows"] for s in doc["shards"])
    doc["fingerprint"] = compute_fingerprint(doc)
    (root / "manifest.json").write_text(json.dumps(doc))
    return Manifest.load(root)


def _actual(shard: int) -> list[int]:
    n = ROWS[shard]
    return [BATCH_ROWS] * (n // BATCH_ROWS) + ([n % BATCH_ROWS] if n % BATCH_ROWS else [])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(shard=st.integers(0, len(ROWS) - 1),
       counts=st.lists(st.integers(0, 3 * BATCH_ROWS), min_size=1, max_size=8),
       mode=st.sampled_from(["kernels", "records", "pyarrow"]))
def test_corrupted_batch_row_counts_raise_a_typed_error(pristine: Path, shard: int,
                                                       counts: list[int], mode: str) -> None:
    if [c for c in counts if c] == _actual(shard) or not sum(counts):
        return  # not a corruption (or a shard emptied: no id reaches it)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "d"
        shutil.copytree(pristine, root)
        m = _corrupt(root, shard, counts)
        src = ArrowSource(m, fast=mode != "pyarrow", row_major=mode == "records",
                          row_major_dir=None)
        start = int(m.shard_rows[:shard].sum())
        ids = np.arange(start, start + int(m.shard_rows[shard]), dtype=np.int64)
        try:
            with pytest.raises(ShardIntegrityError, match=f"shard {shard} ") as info:
                src.fetch(ids[::-1].copy())  # every row the manifest promises, reversed
            assert info.value.shard in (None, m.shards[shard].path)
        finally:
            src.close()


def test_the_loader_raises_it_and_names_the_shard(pristine: Path, tmp_path: Path) -> None:
    root = tmp_path / "d"
    shutil.copytree(pristine, root)
    _corrupt(root, 1, [BATCH_ROWS] * 3 + [9])  # 33 rows listed, the file holds 25
    dl = DataLoader(root, batch_size=16, shuffle=False, read=ReadOptions(row_major=False))
    with pytest.raises(ShardIntegrityError,
                       match=r"shard 1 .*8 x 3 \+ 1 rows .*manifest lists 8 x 3 \+ 9") as info:
        list(dl)
    dl.close()
    assert info.value.shard == "shards/00001.arrow"


def test_untouched_manifest_reads_fine(pristine: Path) -> None:
    m = Manifest.load(pristine)
    for fast in (True, False):
        src = ArrowSource(m, fast=fast, row_major=False)
        try:
            batch = src.fetch(np.arange(m.num_samples, dtype=np.int64)[::-1].copy())
        finally:
            src.close()
        assert batch["id"].tolist() == list(range(m.num_samples))[::-1]


def test_rows_past_a_shard_are_refused_per_batch_too() -> None:
    """The per-batch check alone (metadata that slipped past the open-time check)."""
    from stoker.loader.fastpath.plan import FastPlan, ShardData

    table = pa.table({"x": np.arange(10, dtype=np.float32)})
    data = ShardData(table.to_batches(max_chunksize=4), None, ["x"])
    plan = FastPlan(table.schema, ["x"], [], [])
    starts = np.array([0, 12], dtype=np.int64)  # the "manifest" says 12 rows, the data has 10
    plan.groups(np.arange(10, dtype=np.int64), starts, lambda i: data)  # in range: fine
    with pytest.raises(ShardIntegrityError, match="row 11 was asked for.*hold 10 rows"):
        plan.groups(np.array([3, 11], dtype=np.int64), starts, lambda i: data)
