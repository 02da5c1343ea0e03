"""Byte identity: the same inputs and options give the same bytes for any worker count."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stoker.sharder import shard


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_byte_identical_across_workers_and_runs(parquet_dir: Path, tmp_path: Path,
                                                compression: str, tree_bytes) -> None:
    outputs = {}
    for run, workers in enumerate([1, 2, 4, 1]):
        dst = tmp_path / f"out-{run}"
        shard(parquet_dir, dst, rows_per_shard=3000, workers=workers, compression=compression,
              progress=False)
        outputs[run] = tree_bytes(dst)
    assert sorted(outputs[0]) == ["manifest.json"] + [f"shards/{i:05d}.arrow" for i in range(7)]
    for run in (1, 2, 3):
        assert outputs[run] == outputs[0], f"run {run} differs from run 0"


def test_round_trip_keeps_rows_in_order(parquet_dir: Path, tmp_path: Path, read_dataset,
                                        expected_table) -> None:
    m = shard(parquet_dir, tmp_path / "out", rows_per_shard=4000, progress=False)
    assert m.shard_rows.tolist() == [4000] * 5 + [1000]
    assert read_dataset(tmp_path / "out").equals(expected_table())
    assert m.arrow_schema.metadata is None


def test_output_does_not_depend_on_where_the_source_lives(parquet_dir: Path, tmp_path: Path,
                                                          tree_bytes) -> None:
    moved = tmp_path / "elsewhere" / "src"
    moved.mkdir(parents=True)
    for f in parquet_dir.iterdir():
        (moved / f.name).write_bytes(f.read_bytes())
    a = shard(parquet_dir, tmp_path / "a", rows_per_shard=5000, progress=False)
    b = shard(moved, tmp_path / "b", rows_per_shard=5000, progress=False)
    assert a.fingerprint == b.fingerprint
    assert tree_bytes(tmp_path / "a") == tree_bytes(tmp_path / "b")
    assert [s["path"] for s in a.provenance["sources"]] == [
        "part-0.parquet", "part-1.parquet", "part-2.parquet"]


def test_record_batches_hold_a_block_of_rows_at_most(parquet_dir: Path, tmp_path: Path,
                                                    expected_table) -> None:
    """By default a batch holds 1,024 rows (4 MiB of ~400-byte rows would be ~10 k); a
    smaller ``batch_bytes`` sizes them by bytes below that."""
    m = shard(parquet_dir, tmp_path / "out", rows_per_shard=21000, progress=False)
    assert m.shards[0].batch_rows == (1024,) * 20 + (21000 - 20 * 1024,)
    table = expected_table()
    row_bytes = table.nbytes / table.num_rows
    m = shard(parquet_dir, tmp_path / "small", rows_per_shard=21000, batch_bytes=100_000,
              progress=False)
    batch_rows = m.shards[0].batch_rows
    assert len(set(batch_rows[:-1])) == 1 and batch_rows[-1] <= batch_rows[0]
    assert abs(batch_rows[0] * row_bytes / 100_000 - 1) < 0.05
    assert batch_rows[0] == 100_000 * 21000 // m.shards[0].extra["arrow_bytes"]
    m = shard(parquet_dir, tmp_path / "rows", rows_per_shard=21000, batch_rows=5000,
              progress=False)
    assert m.shards[0].batch_rows == (5000,) * 4 + (1000,)


def test_narrow_rows_keep_batches_of_at_least_256_kib(tmp_path: Path) -> None:
    """1,024 rows of one int64 column are 8 KiB: batches then hold 256 KiB of rows."""
    pq.write_table(pa.table({"x": np.arange(100_000, dtype=np.int64)}), tmp_path / "n.parquet")
    m = shard(tmp_path / "n.parquet", tmp_path / "out", progress=False)
    per_batch = (256 << 10) * 100_000 // m.shards[0].extra["arrow_bytes"]  # ~32 k rows
    assert 30_000 < per_batch and m.shards[0].batch_rows[:3] == (per_batch,) * 3


def test_shard_size_converts_bytes_to_rows(parquet_dir: Path, tmp_path: Path,
                                           expected_table) -> None:
    m = shard(parquet_dir, tmp_path / "out", shard_size="2MB", progress=False)
    per_shard = m.provenance["options"]["rows_per_shard"]
    row_bytes = expected_table().slice(0, 7000).nbytes / 7000
    assert abs(per_shard * row_bytes / 2_000_000 - 1) < 0.05
    assert m.shard_rows.tolist()[:-1] == [per_shard] * (m.num_shards - 1)
    assert m.provenance["options"] == {"batch_bytes": 4 << 20, "batch_rows": 1024,
                                       "columns": None,
                                       "compression": "none", "format": "parquet",
                                       "rows_per_shard": per_shard}


def test_progress_bar_goes_to_stderr_only_when_asked(parquet_dir: Path, tmp_path: Path,
                                                     capsys) -> None:
    shard(parquet_dir, tmp_path / "quiet", rows_per_shard=10000, progress=False)
    assert capsys.readouterr() == ("", "")
    shard(parquet_dir, tmp_path / "loud", rows_per_shard=10000, progress=True)
    out, err = capsys.readouterr()
    assert out == "" and "shard:" in err and "/21.0k" in err and "rows/s" in err


class _BackwardsExecutor:
    """Another engine: runs the tasks last-first and yields results in that order."""

    def map(self, fn, tasks):
        return (fn(t) for t in reversed(list(tasks)))


def test_any_executor_gives_the_same_bytes(parquet_dir: Path, tmp_path: Path,
                                           tree_bytes) -> None:
    shard(parquet_dir, tmp_path / "local", rows_per_shard=2500, progress=False)
    shard(parquet_dir, tmp_path / "other", rows_per_shard=2500, progress=False,
          executor=_BackwardsExecutor())
    assert tree_bytes(tmp_path / "other") == tree_bytes(tmp_path / "local")
