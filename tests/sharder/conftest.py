"""Shared fixtures of the sharder tests: small synthetic inputs and output readers."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from stoker.manifest import Manifest
from stoker.sharder.synthetic import make_tabular_table, write_tabular_parquet

# (rows, row_group_rows) of the three Parquet inputs: uneven on purpose, so shards span files
# and start inside row groups.
PARTS = ((7000, 2000), (5000, 1500), (9000, 4000))


@pytest.fixture(scope="session")
def parquet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three synthetic Parquet files (21,000 rows in all) in one directory."""
    root = tmp_path_factory.mktemp("parquet_src")
    start = 0
    for i, (rows, group) in enumerate(PARTS):
        write_tabular_parquet(root / f"part-{i}.parquet", rows, seed=start, row_group_rows=group)
        start += rows
    return root


def _expected_table(columns: list[str] | None = None) -> pa.Table:
    """The rows of ``parquet_dir`` in order."""
    start, tables = 0, []
    for rows, _ in PARTS:
        tables.append(make_tabular_table(rows, seed=start))
        start += rows
    table = pa.concat_tables(tables)
    return table.select(columns) if columns else table


def _read_dataset(dst: str | os.PathLike[str]) -> pa.Table:
    """Every shard of the dataset at ``dst``, concatenated in manifest order."""
    manifest = Manifest.load(dst)
    tables = []
    for i in range(manifest.num_shards):
        with pa.memory_map(manifest.shard_location(i)) as f:
            reader = pa.ipc.open_file(f)
            assert reader.num_record_batches == len(manifest.shards[i].batch_rows)
            assert [reader.get_batch(b).num_rows for b in range(reader.num_record_batches)] \
                == list(manifest.shards[i].batch_rows)
            tables.append(reader.read_all())
    return pa.concat_tables(tables)


def _tree_bytes(root: str | os.PathLike[str]) -> dict[str, bytes]:
    """Every file under ``root`` (relative POSIX path -> bytes)."""
    root = Path(root)
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


# pytest's importlib mode cannot import conftest as a module: helpers travel as fixtures.
@pytest.fixture(scope="session")
def expected_table():
    """``expected_table(columns=None)``: the rows of ``parquet_dir`` in order."""
    return _expected_table


@pytest.fixture(scope="session")
def read_dataset():
    """``read_dataset(dst)``: every shard concatenated in manifest order (batches checked)."""
    return _read_dataset


@pytest.fixture(scope="session")
def tree_bytes():
    """``tree_bytes(root)``: relative path -> bytes of every file under ``root``."""
    return _tree_bytes
