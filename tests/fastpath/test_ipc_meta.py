"""The kernels' metadata read from an IPC file's own flatbuffers (stoker.loader.fastpath.ipc_meta)
is exactly what pyarrow's arrays give, column by column and record batch by record batch; a
file it cannot parse falls back to pyarrow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stoker.loader.fastpath import ipc_meta
from stoker.loader.fastpath import plan as plan_mod
from stoker.loader.fastpath.ipc_meta import read_layout
from stoker.loader.fastpath.plan import NotZeroCopy, ShardData, _kind, _Locator


def _column(kind: str, rows: int, rng: np.random.Generator, nulls: bool) -> pa.Array:
    mask = (rng.random(rows) < 0.3) if nulls else None
    if kind == "f32":
        return pa.array(rng.random(rows, dtype=np.float32), mask=mask)
    if kind == "i64":
        return pa.array(rng.integers(-9, 9, rows), mask=mask)
    if kind == "i8":
        return pa.array(rng.integers(-9, 9, rows).astype(np.int8), mask=mask)
    if kind == "bool":
        return pa.array(rng.random(rows) < 0.5, mask=mask)
    if kind == "date":
        return pa.array(rng.integers(0, 9999, rows).astype(np.int32), pa.date32(), mask=mask)
    if kind == "dict":
        return pa.DictionaryArray.from_arrays(  # one dictionary for all batches of a file
            pa.array(rng.integers(0, 3, rows).astype(np.int8), mask=mask), WORDS)
    if kind in ("list", "large_list"):
        lengths = rng.integers(0, 4, rows)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        values = pa.array(rng.random(int(offsets[-1])), mask=rng.random(int(offsets[-1])) < 0.2)
        cls = pa.ListArray if kind == "list" else pa.LargeListArray
        off_type = np.int32 if kind == "list" else np.int64
        return cls.from_arrays(pa.array(offsets.astype(off_type)), values,
                               mask=pa.array(mask) if mask is not None else None)
    if kind in ("binary", "string", "large_string"):
        words = [("x" * int(n)) for n in rng.integers(0, 6, rows)]
        t = {"binary": pa.binary(), "string": pa.string(), "large_string": pa.large_string()}[kind]
        return pa.array([w.encode() if kind == "binary" else w for w in words], t, mask=mask)
    if kind == "struct":
        return pa.StructArray.from_arrays([pa.array(rng.integers(0, 5, rows)),
                                           pa.array([str(i) for i in range(rows)])], ["p", "q"])
    raise AssertionError(kind)


WORDS = pa.array(["a", "b", "c"])
KINDS = ["f32", "i64", "i8", "bool", "date", "dict", "list", "large_list", "binary", "string",
         "large_string", "struct"]


def _write(path: Path, kinds: list[str], batch_rows: list[int], nulls: list[bool],
           seed: int, compression: str | None = None) -> Path:
    rng = np.random.default_rng(seed)
    names = [f"{k}{i}" for i, k in enumerate(kinds)]
    batches = [pa.record_batch([_column(k, n, rng, nl) for k, nl in zip(kinds, nulls)], names)
               for n in batch_rows]
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.OSFile(str(path), "wb") as sink, \
            pa.ipc.new_file(sink, batches[0].schema, options=options) as w:
        for b in batches:
            w.write_batch(b)
    return path


def _open(path: Path) -> tuple[list[pa.RecordBatch], pa.Buffer]:
    source = pa.memory_map(str(path), "r")
    arena = source.read_buffer(source.size())
    return pa.ipc.open_file(arena).read_all().to_batches(), arena


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=6),
       batch_rows=st.lists(st.integers(1, 300), min_size=1, max_size=5),
       nulls=st.lists(st.booleans(), min_size=6, max_size=6), seed=st.integers(0, 2**16))
def test_layout_metadata_equals_pyarrows(tmp_path: Path, kinds: list[str], batch_rows: list[int],
                                         nulls: list[bool], seed: int) -> None:
    batches, arena = _open(_write(tmp_path / "s.arrow", kinds, batch_rows, nulls, seed))
    layout = read_layout(arena, batches[0].schema)
    assert layout is not None
    assert layout.rows.tolist() == [b.num_rows for b in batches]
    # every message at once (NumPy) reads what the message-by-message loop reads
    buf = memoryview(arena)
    _, blocks = ipc_meta._blocks(buf)
    nodes, buffers = layout.nodes.shape[1], layout.buffers.shape[1]
    for at_once, one_by_one in zip(ipc_meta._messages_at_once(buf, blocks, nodes, buffers),
                                   ipc_meta._messages(buf, blocks, nodes, buffers)):
        assert at_once.dtype == one_by_one.dtype == np.int64
        np.testing.assert_array_equal(at_once, one_by_one)
    for name in batches[0].schema.names:
        t = batches[0].schema.field(name).type
        if _kind(t) == "arrow":
            continue
        got = plan_mod._layout_meta(layout, name, t)
        try:
            want = plan_mod._column_meta(batches, name, _Locator(arena))
        except NotZeroCopy:  # pyarrow gives an empty buffer address 0: not in the map, so the
            continue  # old path read the whole shard through pyarrow; the layout knows better
        assert got.dtype == want.dtype and got.shape == want.shape, name
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_shard_data_uses_the_layout_and_reads_the_same_rows(tmp_path: Path) -> None:
    kinds = ["f32", "i64", "list", "binary", "struct"]
    batches, arena = _open(_write(tmp_path / "s.arrow", kinds, [100, 1, 37, 250],
                                  [True, False, True, True, False], 3))
    names = [n for n in batches[0].schema.names if not n.startswith("struct")]
    d = ShardData(batches, arena, names)
    assert d.meta._layout is not None  # type: ignore[attr-defined]
    for name in names:
        np.testing.assert_array_equal(d.meta[name],
                                      plan_mod._column_meta(batches, name, _Locator(arena)))
    chunks = np.array([3, 0], dtype=np.int64)
    np.testing.assert_array_equal(d.matrix_meta_of(["f320", "i641"], chunks),
                                  d.matrix_meta(["f320", "i641"])[chunks])


def test_a_perturbed_layout_is_seen(tmp_path: Path) -> None:
    """The comparison above can fail: one wrong buffer offset is a different row."""
    batches, arena = _open(_write(tmp_path / "s.arrow", ["f32"], [10, 10], [False], 1))
    layout = read_layout(arena, batches[0].schema)
    assert layout is not None
    layout.buffers[1, 1, 0] += 4
    got = plan_mod._layout_meta(layout, "f320", batches[0].schema.field("f320").type)
    assert not np.array_equal(got, plan_mod._column_meta(batches, "f320", _Locator(arena)))


def test_what_it_does_not_parse_falls_back_to_pyarrow(tmp_path: Path) -> None:
    batches, arena = _open(_write(tmp_path / "z.arrow", ["f32", "i64"], [50, 20], [True, False],
                                  2, compression="zstd"))
    assert read_layout(arena, batches[0].schema) is None  # compressed buffers
    with pytest.raises(NotZeroCopy):  # and the pyarrow path still refuses it, as before
        ShardData(batches, arena, ["f320", "i641"])
    assert read_layout(pa.py_buffer(b"not an arrow file at all"), batches[0].schema) is None
    rb = pa.record_batch({"u": pa.array([1, 2], pa.float16())})
    path = tmp_path / "h.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, rb.schema) as w:
        w.write_batch(rb)
    # float16 has a layout (2 buffers) but no kernel: only its metadata would be asked
    h_batches, h_arena = _open(path)
    assert read_layout(h_arena, h_batches[0].schema) is not None
    mixed = pa.record_batch({"m": pa.array([{1: "a"}, {}], pa.map_(pa.int64(), pa.string())),
                             "v": pa.array([1.0, 2.0])})
    path = tmp_path / "m.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, mixed.schema) as w:
        w.write_batch(mixed)
    m_batches, m_arena = _open(path)
    assert read_layout(m_arena, m_batches[0].schema) is None  # a map: layout unknown here
    d = ShardData(m_batches, m_arena, ["v"])  # pyarrow's metadata, as before
    np.testing.assert_array_equal(d.meta["v"], plan_mod._column_meta(m_batches, "v",
                                                                     _Locator(m_arena)))
