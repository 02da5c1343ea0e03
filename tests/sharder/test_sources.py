"""Every source kind reads back as the same rows, in order, with one unified schema."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
import zstandard

from stoker.sharder import shard
from stoker.sharder.synthetic import make_tabular_table


def _small(n: int = 50, start: int = 0) -> pa.Table:
    t = make_tabular_table(n, seed=7, start=start)
    return t.select(["f0", "c0", "label"])


def test_glob_and_several_sources(parquet_dir: Path, tmp_path: Path, read_dataset,
                                  expected_table) -> None:
    m = shard([str(parquet_dir / "part-[12].parquet"), parquet_dir / "part-0.parquet"],
              tmp_path / "out", rows_per_shard=6000, progress=False)
    assert [s["path"] for s in m.provenance["sources"]] == [
        "part-0.parquet", "part-1.parquet", "part-2.parquet"]
    assert read_dataset(tmp_path / "out").equals(expected_table())


def test_columns_are_selected_in_the_given_order(parquet_dir: Path, tmp_path: Path,
                                                 read_dataset, expected_table) -> None:
    m = shard(parquet_dir, tmp_path / "out", rows_per_shard=8000, columns=["label", "seq", "f3"],
              progress=False)
    assert [f["name"] for f in m.fields] == ["label", "seq", "f3"]
    assert read_dataset(tmp_path / "out").equals(expected_table(["label", "seq", "f3"]))


def test_hive_partitions_become_columns(tmp_path: Path, read_dataset) -> None:
    src = tmp_path / "hive"
    parts = [("2024", "eu"), ("2024", "us"), ("2025", "eu"), ("__HIVE_DEFAULT_PARTITION__", "us")]
    for i, (year, region) in enumerate(parts):
        folder = src / f"year={year}" / f"region={region}"
        folder.mkdir(parents=True)
        pq.write_table(_small(10, 10 * i), folder / "data.parquet")
    (src / "_SUCCESS").write_text("")
    m = shard(src, tmp_path / "out", rows_per_shard=15, progress=False)
    got = read_dataset(tmp_path / "out")
    assert got.schema.field("year").type == pa.int64()
    assert got.schema.field("region").type == pa.string()
    assert got.column("year").to_pylist() == [2024] * 20 + [2025] * 10 + [None] * 10
    assert got.column("region").to_pylist() == ["eu"] * 10 + ["us"] * 10 + ["eu"] * 10 + ["us"] * 10
    # Files sort by relative path, so the default partition folder comes last.
    assert got.select(["f0", "c0", "label"]).equals(
        pa.concat_tables([_small(10, 10 * i) for i in range(4)]))
    assert m.num_shards == 3
    only = shard(src, tmp_path / "only", columns=["region"], shard_size="1KB", progress=False)
    assert read_dataset(tmp_path / "only").column("region").to_pylist() == \
        got.column("region").to_pylist()
    assert only.num_samples == 40


def test_csv_round_trip(tmp_path: Path, read_dataset) -> None:
    table = _small(40)
    pcsv.write_csv(table.slice(0, 25), tmp_path / "a.csv")
    pcsv.write_csv(table.slice(25), tmp_path / "b.csv")
    shard(tmp_path, tmp_path.parent / f"{tmp_path.name}-out", rows_per_shard=16, progress=False)
    got = read_dataset(tmp_path.parent / f"{tmp_path.name}-out")
    assert got.column("c0").to_pylist() == table.column("c0").to_pylist()
    assert got.column("f0").to_pylist() == pytest.approx(table.column("f0").to_pylist())


def _jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def test_jsonl_types_are_unified_across_files(tmp_path: Path, read_dataset) -> None:
    src = tmp_path / "src"
    src.mkdir()
    # a.jsonl alone would infer x as int64 and y as null; b.jsonl has doubles and strings.
    (src / "a.jsonl").write_bytes(_jsonl([{"x": 1, "y": None}, {"x": 2, "y": None}]))
    (src / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(
        _jsonl([{"x": 2.5, "y": "hi"}, {"x": 3, "y": "yo", "z": True}])))
    m = shard(src, tmp_path / "out", rows_per_shard=1, progress=False)
    got = read_dataset(tmp_path / "out")
    assert m.num_shards == 4
    assert got.schema.field("x").type == pa.float64()
    assert got.schema.field("y").type == pa.string()
    assert got.to_pydict() == {"x": [1.0, 2.0, 2.5, 3.0], "y": [None, None, "hi", "yo"],
                               "z": [None, None, None, True]}


def test_format_override_reads_unusual_extensions(tmp_path: Path, read_dataset) -> None:
    src = tmp_path / "data.txt"
    src.write_bytes(_jsonl([{"a": i} for i in range(5)]))
    shard(src, tmp_path / "out", format="jsonl", progress=False)
    assert read_dataset(tmp_path / "out").column("a").to_pylist() == list(range(5))


def test_csv_types_widen_across_files(tmp_path: Path, read_dataset) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.csv").write_text("n,s,e\n1,x,\n2,y,\n")
    (src / "b.csv").write_text("n,s,e\n2.5,z,\n")
    shard(src, tmp_path / "out", rows_per_shard=2, progress=False)
    got = read_dataset(tmp_path / "out")
    assert [str(f.type) for f in got.schema] == ["double", "string", "null"]
    assert got.to_pydict() == {"n": [1.0, 2.0, 2.5], "s": ["x", "y", "z"], "e": [None] * 3}


def test_wider_value_after_the_first_block_widens_the_type(tmp_path: Path, read_dataset) -> None:
    src = tmp_path / "big.csv"
    # ~2.4 MB: the streaming reader's first 1 MB block holds only integers.
    src.write_text("n\n" + "12345678901\n" * 200_000 + "2.5\n")
    m = shard(src, tmp_path / "out", rows_per_shard=150_000, progress=False)
    got = read_dataset(tmp_path / "out").column("n")
    assert got.type == pa.float64() and m.num_samples == 200_001
    assert got[0].as_py() == 12345678901.0 and got[-1].as_py() == 2.5


def test_text_files_streamed_in_groups_give_the_same_bytes(tmp_path: Path, read_dataset,
                                                           tree_bytes) -> None:
    src = tmp_path / "src"
    src.mkdir()
    lines = [f"{i},{i * 0.5},row-{i % 97}\n" for i in range(125_000)]
    # Two ~1.6 MB files: several 1 MB reader blocks each, shards that span both files.
    (src / "a.csv").write_text("i,f,s\n" + "".join(lines[:60_000]))
    (src / "b.csv").write_text("i,f,s\n" + "".join(lines[60_000:]))
    for workers in (1, 2, 4):
        shard(src, tmp_path / f"w{workers}", rows_per_shard=7000, workers=workers,
              progress=False)
    assert tree_bytes(tmp_path / "w2") == tree_bytes(tmp_path / "w1")
    assert tree_bytes(tmp_path / "w4") == tree_bytes(tmp_path / "w1")
    got = read_dataset(tmp_path / "w1")
    assert got.column("i").to_pylist() == list(range(125_000))
    assert got.column("s")[-1].as_py() == f"row-{124_999 % 97}"
