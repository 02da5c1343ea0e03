"""A shard's record batches read by pyarrow only when asked for
(stoker.loader.fastpath.ipc_meta.FileBatches): the same batches, tables and list widths as pyarrow's
``read_all`` gives, and a shard served by its stored records never asks."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))  # for fastpath_helpers (importlib mode)

from fastpath_helpers import write_dataset  # noqa: E402

from stoker.loader.fastpath.ipc_meta import FileBatches, batch_rows  # noqa: E402
from stoker.loader.fastpath.rowmajor import _list_width  # noqa: E402
from stoker.loader.read.arrow import ArrowSource  # noqa: E402


def _mapped(path: Path) -> pa.Buffer:
    source = pa.memory_map(str(path), "r")
    return source.read_buffer(source.size())


def _write(path: Path, batches: list[pa.RecordBatch], schema: pa.Schema,
           compression: str | None = None) -> pa.Buffer:
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_file(str(path), schema, options=options) as writer:
        for b in batches:
            writer.write_batch(b)
    return _mapped(path)


def _lists(lengths: list[int], kind: str, nulls: bool, size: int) -> pa.Array:
    if kind == "fixed_size_list":
        values = pa.array(np.arange(len(lengths) * size, dtype=np.float32))
        return pa.FixedSizeListArray.from_arrays(values, size)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(
        np.int64 if kind == "large_list" else np.int32)
    values = pa.array(np.arange(int(offsets[-1]), dtype=np.float32))
    mask = pa.array([i == 0 for i in range(len(lengths))]) if nulls and lengths else None
    cls = pa.ListArray if kind == "list" else pa.LargeListArray
    return cls.from_arrays(pa.array(offsets), values, mask=mask)


def test_batches_and_tables_are_pyarrows(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    schema = pa.schema([("x", pa.float32()), ("s", pa.string()), ("l", pa.list_(pa.int64()))])
    batches = [pa.record_batch([pa.array(rng.random(n, dtype=np.float32)),
                                pa.array([str(i) for i in range(n)]),
                                pa.array([[i] * (i % 3) for i in range(n)], pa.list_(pa.int64()))],
                               schema=schema) for n in (5, 0, 7, 3)]
    arena = _write(tmp_path / "f.arrow", batches, schema)
    lazy = FileBatches.open(arena)
    assert isinstance(lazy, FileBatches)
    assert batch_rows(lazy).tolist() == [5, 0, 7, 3]
    whole = pa.ipc.open_file(arena).read_all()
    want = whole.to_batches()
    assert len(lazy) == len(want) and not lazy._read  # nothing read yet
    assert all(lazy[i].equals(want[i]) for i in range(len(want)))
    assert lazy[-1].equals(want[-1]) and [b.num_rows for b in lazy[1:3]] == [0, 7]
    with pytest.raises(IndexError):
        lazy[4]
    assert lazy.table(["l", "x"]).equals(whole.select(["l", "x"]))
    assert lazy.table(["s"]).equals(whole.select(["s"]))


def test_a_compressed_file_is_read_by_pyarrow_at_once(tmp_path: Path) -> None:
    schema = pa.schema([("x", pa.int64())])
    arena = _write(tmp_path / "z.arrow", [pa.record_batch([pa.array(np.arange(100))], schema=schema)],
                   schema, compression="zstd")
    table = FileBatches.open(arena)
    assert isinstance(table, pa.Table) and table.column(0).to_pylist() == list(range(100))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["list", "large_list", "fixed_size_list"]),
       sizes=st.lists(st.integers(0, 6), min_size=1, max_size=5),
       width=st.integers(0, 4), ragged=st.booleans(), nulls=st.booleans(),
       sliced=st.booleans())
def test_list_widths_from_the_files_offsets_are_pyarrows(
        tmp_path: Path, kind: str, sizes: list[int], width: int, ragged: bool, nulls: bool,
        sliced: bool) -> None:
    rng = np.random.default_rng(sum(sizes) + width)
    batches = []
    for n in sizes:
        lengths = [width] * n
        if ragged and n and kind != "fixed_size_list":
            lengths[int(rng.integers(n))] = width + 1
        array = _lists([width] + lengths if sliced else lengths, kind, nulls, max(width, 1))
        batches.append(pa.record_batch([array.slice(1) if sliced else array], names=["l"]))
    schema = batches[0].schema
    arena = _write(tmp_path / f"l{kind}.arrow", batches, schema)
    lazy = FileBatches.open(arena)
    assert isinstance(lazy, FileBatches)
    want = _list_width(pa.ipc.open_file(arena).read_all().to_batches(), "l")
    assert _list_width(lazy, "l") == want
    if kind != "fixed_size_list":
        assert not lazy._read  # read from the offsets in the file


def test_a_shard_served_by_stored_records_reads_no_record_batch(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    features = [f"f{j}" for j in range(4)]
    tables = [pa.table({**{c: rng.random(3000, dtype=np.float32) for c in features},
                        "seq": pa.array([[float(i)] * 4 for i in range(3000)],
                                        pa.list_(pa.float32()))}) for _ in range(2)]
    manifest = write_dataset(tmp_path / "data", tables, batch_rows=256)
    ids = rng.permutation(6000)[:1024]
    want = ArrowSource(manifest, features=features, row_major=False)
    try:
        expected = {k: v.numpy().tobytes() for k, v in want.fetch(ids).items()}
    finally:
        want.close()
    records = str(tmp_path / "records")
    first = ArrowSource(manifest, features=features, row_major=True, row_major_dir=records)
    try:
        first.fetch(ids)
        first.wait_row_major()
    finally:
        first.close()
    again = ArrowSource(manifest, features=features, row_major=True, row_major_dir=records)
    try:
        got = {k: v.numpy().tobytes() for k, v in again.fetch(ids).items()}
        opened = [entry[0] for entry in again._shards._open.values()]
        assert len(opened) == 2 and all(isinstance(b, FileBatches) for b in opened)
        assert [len(b._read) for b in opened] == [0, 0]
        assert again._shards.table(1).equals(  # the Arrow path still has its table
            pa.Table.from_batches(pa.ipc.open_file(manifest.shard_location(1)).read_all()
                                  .to_batches()).select(again._shards._columns))
    finally:
        again.close()
    assert got == expected and set(got) >= {"features", "seq"}
