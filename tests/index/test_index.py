"""``stoker index``: Parquet row groups and WebDataset byte offsets read in place, with the
loader's order, resume and audit guarantees; changed files detected; export round trips."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from source_fixtures import dataset_bytes, expected_tar_rows, read_dataset, write_tars

from stoker.loader import DataLoader
from stoker.manifest import Manifest, ShardIntegrityError
from stoker.sharder import SharderError, shard
from stoker.tools.cli import main
from stoker.tools.export import ExportError, export


def _parquet_tree(root: Path) -> pa.Table:
    """Hive-partitioned Parquet files with uneven row groups; returns the rows in index order."""
    tables = []
    start = 0
    for part, (rows, group) in (("day=1/a.parquet", (130, 40)), ("day=1/b.parquet", (70, 70)),
                                ("day=2/c.parquet", (95, 30))):
        x = np.arange(start, start + rows, dtype=np.int64)
        t = pa.table({"x": x, "y": (x * 0.5).astype(np.float32),
                      "s": [f"v{i}" for i in x]})
        (root / part).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(t, root / part, row_group_size=group)
        tables.append(t.append_column("day", pa.array([int(part[4])] * rows, pa.int64())))
        start += rows
    return pa.concat_tables(tables)


def _ids(loader: DataLoader) -> list[int]:
    return [int(v) for batch in loader for v in batch["x"]]


@pytest.fixture()
def pq_index(tmp_path: Path) -> tuple[Path, pa.Table]:
    root = tmp_path / "data"
    expected = _parquet_tree(root)
    assert main(["index", str(root), "--quiet"]) == 0
    return root, expected


def test_parquet_index_is_row_group_granular_and_in_place(pq_index) -> None:
    root, expected = pq_index
    m = Manifest.load(root)
    assert m.kind == "parquet-index"
    assert [s.path for s in m.shards] == ["day=1/a.parquet", "day=1/b.parquet", "day=2/c.parquet"]
    assert [s.batch_rows for s in m.shards] == [(40, 40, 40, 10), (70,), (30, 30, 30, 5)]
    assert [s.extra["partitions"] for s in m.shards] == [[1], [1], [2]]
    assert sorted(os.listdir(root)) == ["day=1", "day=2", "manifest.json"]  # nothing rewritten
    loader = DataLoader(str(root), batch_size=32, shuffle=False)
    rows = [dict(zip(b, vals)) for b in loader for vals in zip(*(b[k] for k in b))]
    assert [int(r["x"]) for r in rows] == expected.column("x").to_pylist()
    assert [r["s"] for r in rows] == expected.column("s").to_pylist()
    assert [int(r["day"]) for r in rows] == expected.column("day").to_pylist()
    assert main(["verify", str(root), "--quiet"]) == 0
    assert main(["inspect", str(root)]) == 0
    before = (root / "manifest.json").read_bytes()
    assert main(["index", str(root), "--overwrite", "--workers", "2", "--quiet"]) == 0
    assert (root / "manifest.json").read_bytes() == before  # any worker count, same manifest
    some = next(iter(DataLoader(str(root), batch_size=200, shuffle=False, columns=["day", "s"])))
    assert sorted(some) == ["day", "s"] and some["s"] == expected.column("s").to_pylist()[:200]


def test_parquet_index_order_is_deterministic_across_workers_and_resumes(pq_index) -> None:
    root, expected = pq_index
    base = _ids(DataLoader(str(root), batch_size=16, shuffle=True, seed=5))
    assert sorted(base) == expected.column("x").to_pylist() and base != sorted(base)
    assert _ids(DataLoader(str(root), batch_size=16, shuffle=True, seed=5, num_workers=2)) == base
    first = DataLoader(str(root), batch_size=16, shuffle=True, seed=5)
    it = iter(first)
    head = [int(v) for _ in range(7) for v in next(it)["x"]]
    state = first.state_dict()
    second = DataLoader(str(root), batch_size=16, shuffle=True, seed=5, num_workers=2)
    second.load_state_dict(state)
    assert head + _ids(second) == base


def test_parquet_index_ledger_passes_the_audit_replay(pq_index, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = pq_index
    ledger = tmp_path / "run.ledger"
    loader = DataLoader(str(root), batch_size=16, shuffle=True, seed=9, ledger=str(ledger))
    _ids(loader)
    loader.close()
    report = tmp_path / "audit.json"
    assert main(["audit", str(ledger), "--dataset", str(root), "--json", str(report), "-q"]) == 0
    assert json.loads(report.read_text())["checks"]["replay"]["status"] == "pass"


def test_changed_file_is_detected_with_its_name(pq_index) -> None:
    root, _ = pq_index
    target = root / "day=2" / "c.parquet"
    data = bytearray(target.read_bytes())
    data[100] ^= 0xFF  # same size, different bytes
    target.write_bytes(bytes(data))
    with pytest.raises(ShardIntegrityError, match=r"c\.parquet: file changed after it was "
                       r"indexed \(xxh3-128"):
        _ids(DataLoader(str(root), batch_size=64, shuffle=False))
    from stoker.loader.read.indexed.source import IndexSource

    lenient = IndexSource(Manifest.load(root), verify="size")  # same size: not noticed
    assert lenient.take(np.arange(290, 295)).num_rows == 5
    target.write_bytes(bytes(data[:-10]))
    with pytest.raises(ShardIntegrityError, match=r"c\.parquet.*size \d+ bytes, indexed"):
        IndexSource(Manifest.load(root), verify="size").take(np.arange(290, 295))
    with pytest.raises(ShardIntegrityError, match=r"c\.parquet.*size \d+ bytes, indexed"):
        _ids(DataLoader(str(root), batch_size=64, shuffle=False))
    assert main(["verify", str(root), "--quiet"]) == 1


def test_parquet_index_errors(tmp_path: Path, pq_index) -> None:
    from stoker.sharder.index import index

    root, _ = pq_index
    with pytest.raises(SharderError, match="already holds a manifest.json"):
        index(root)
    pq.write_table(pa.table({"x": pa.array(["a"]), "y": pa.array([1.0], pa.float32()),
                             "s": ["z"]}), root / "day=2" / "d.parquet")
    assert main(["index", str(root), "--overwrite", "--quiet"]) == 1
    with pytest.raises(SharderError, match=r"field 'x' is int64 in .* but string in .*d\.parquet"):
        index(root, overwrite=True)
    with pytest.raises(SharderError, match="not inside DST"):
        index(root / "day=1", tmp_path / "elsewhere")


def test_webdataset_index_reads_samples_by_offset(tmp_path: Path) -> None:
    root = tmp_path / "tars"
    write_tars(root, long_keys=True)  # > 100-char names: PAX headers inside the spans
    assert main(["index", str(root), "--quiet"]) == 0
    m = Manifest.load(root)
    assert m.kind == "webdataset-index" and m.num_samples == 42
    assert len(m.shards[0].extra["offsets"]) == 14
    expected = expected_tar_rows()
    for r in expected:
        r["__key__"] = "d" * 120 + "/" + r["__key__"]
    loader = DataLoader(str(root), batch_size=5, shuffle=False)
    got = [dict(zip(b, vals)) for b in loader for vals in zip(*(b[k] for k in b))]
    assert [g["__key__"] for g in got] == [r["__key__"] for r in expected]
    assert [g["jpg"] for g in got] == [r["jpg"] for r in expected]
    assert [int(g["cls"]) for g in got] == [r["cls"] for r in expected]
    keys = [k for b in DataLoader(str(root), batch_size=5, shuffle=True, seed=1, num_workers=2)
            for k in b["__key__"]]
    assert sorted(keys) == sorted(r["__key__"] for r in expected)


def test_webdataset_index_refuses_compressed_tars(tmp_path: Path) -> None:
    write_tars(tmp_path / "z", compress="zst")
    from stoker.sharder.index import index

    with pytest.raises(SharderError, match="compressed tar"):
        index(tmp_path / "z")


def test_export_round_trips(tmp_path: Path) -> None:
    write_tars(tmp_path / "tars", compress="gz")
    shard(tmp_path / "tars", tmp_path / "ds", rows_per_shard=10)
    assert main(["export", str(tmp_path / "ds"), "--to", "webdataset", str(tmp_path / "wds"),
                 "--quiet"]) == 0
    first = dataset_bytes(tmp_path / "wds")
    assert sorted(first) == [f"shard-0000{i}.tar" for i in range(5)]
    shard(tmp_path / "wds", tmp_path / "again", rows_per_shard=10)
    assert read_dataset(tmp_path / "again").equals(read_dataset(tmp_path / "ds"))
    export(tmp_path / "ds", tmp_path / "wds", to="webdataset", overwrite=True)
    assert dataset_bytes(tmp_path / "wds") == first  # deterministic tars
    with pytest.raises(ExportError, match="not empty"):
        export(tmp_path / "ds", tmp_path / "wds", to="parquet")
    export(tmp_path / "ds", tmp_path / "pq", to="parquet")
    back = pa.concat_tables(pq.read_table(p) for p in sorted((tmp_path / "pq").iterdir()))
    assert back.equals(read_dataset(tmp_path / "ds"))


def test_export_of_an_index_dataset(pq_index, tmp_path: Path) -> None:
    root, expected = pq_index
    assert main(["export", str(root), "--to", "parquet", str(tmp_path / "out"), "--quiet"]) == 0
    back = pa.concat_tables(pq.read_table(p) for p in sorted((tmp_path / "out").iterdir()))
    assert back.to_pylist() == expected.to_pylist()
