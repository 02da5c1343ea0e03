"""Fused gather kernels against a slow pure-Python reference (Hypothesis, bounded)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))  # for fastpath_helpers (importlib mode)

from fastpath_helpers import random_array  # noqa: E402

from stoker.loader.fastpath.plan import FastPlan, ShardData  # noqa: E402
from stoker.loader.fastpath.ring import BufferRing  # noqa: E402

FIXED = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(),
         pa.uint64(), pa.float32(), pa.float64(), pa.bool_(), pa.date32(), pa.timestamp("ms"),
         pa.dictionary(pa.int32(), pa.string())]
LISTS = [pa.list_(pa.float32()), pa.large_list(pa.int16()), pa.list_(pa.float64())]
VARS = [pa.binary(), pa.large_binary(), pa.string()]


def _shard(types: list[pa.DataType], rows: list[int], rng: np.random.Generator, nulls: float,
           skew: int) -> list[pa.RecordBatch]:
    """Record batches whose arrays are slices (non-zero Arrow offsets) of longer arrays."""
    names = [f"c{i}" for i in range(len(types))]
    out = []
    for n in rows:
        arrays = [random_array(t, n + skew, rng, nulls).slice(skew, n) for t in types]
        out.append(pa.RecordBatch.from_arrays(arrays, names=names))
    return out


def _ints(arr: pa.Array) -> list[Any]:
    if pa.types.is_dictionary(arr.type):
        return arr.indices.to_pylist()
    if pa.types.is_date32(arr.type) or pa.types.is_timestamp(arr.type):
        return arr.view(pa.int32() if pa.types.is_date32(arr.type) else pa.int64()).to_pylist()
    return arr.to_pylist()


def _reference(table: pa.Table, plan: FastPlan) -> dict[str, Any]:
    """Row by row in Python, following the documented null rules."""
    out: dict[str, Any] = {}
    for o in plan.outputs:
        cols = [_ints(table.column(c).combine_chunks()) for c in o.columns]
        if o.kind == "matrix":
            out[o.name] = np.array([[0 if v is None else v for v in row] for row in zip(*cols)],
                                   dtype=o.dtype).reshape(table.num_rows, len(cols))
        elif o.kind == "fixed":
            out[o.name] = np.array([0 if v is None else v for v in cols[0]], dtype=o.dtype)
        elif o.kind == "list":
            rows = [[0 if v is None else v for v in (r or [])] for r in cols[0]]
            width = max(map(len, rows))
            out[o.name] = np.array([r + [0] * (width - len(r)) for r in rows],
                                   dtype=o.dtype).reshape(len(rows), width)
            if any(len(r) != width for r in rows):
                out[f"{o.name}_lengths"] = np.array([len(r) for r in rows], dtype=np.int64)
        else:
            out[o.name] = cols[0]
    return out


def _check(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert list(got) == list(want)
    for name, w in want.items():
        g = got[name]
        if isinstance(w, np.ndarray):
            g = g.numpy()
            assert g.dtype == w.dtype and g.shape == w.shape, name
            np.testing.assert_array_equal(g, w, err_msg=name)
        else:
            assert g == w, name


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n_cols=st.integers(1, 6), n_shards=st.integers(1, 3),
       nulls=st.sampled_from([0.0, 0.3]), skew=st.integers(0, 9), batch=st.integers(1, 60),
       n_features=st.integers(0, 3))
def test_plan_matches_python_reference(seed: int, n_cols: int, n_shards: int, nulls: float,
                                       skew: int, batch: int, n_features: int) -> None:
    rng = np.random.default_rng(seed)
    pool = FIXED + LISTS + VARS
    types = [pool[i] for i in rng.integers(0, len(pool), n_cols)]
    numeric = [pa.float32(), pa.int64(), pa.uint8(), pa.bool_(), pa.float64(), pa.int16()]
    feats = [numeric[i] for i in rng.integers(0, len(numeric), n_features)]
    cats = [pa.int64(), pa.int8(), pa.dictionary(pa.int32(), pa.string())]
    all_types = types + feats + cats
    shards = [_shard(all_types, [int(r) for r in rng.integers(1, 12, rng.integers(1, 4))],
                     rng, nulls, skew) for _ in range(n_shards)]
    names = shards[0][0].schema.names
    features = names[n_cols:n_cols + n_features]
    categoricals = names[n_cols + n_features:]
    plan = FastPlan(shards[0][0].schema, names, features, categoricals)
    data = [ShardData(b, None, plan.kernel_columns) for b in shards]
    sizes = [sum(b.num_rows for b in s) for s in shards]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    ids = rng.integers(0, starts[-1], batch)  # repeats allowed: a sampler may repeat ids
    whole = pa.Table.from_batches([b for s in shards for b in s])
    ring = BufferRing(2)
    slot = ring.acquire()
    got = plan.run(plan.groups(ids, starts, data.__getitem__), batch, slot, lambda cols: {})
    ring.release(slot)
    _check(got, _reference(whole.take(pa.array(ids)), plan))


def test_list_child_with_its_own_offset() -> None:
    """A list whose values array is itself sliced: both offsets must be applied."""
    values = pa.array(np.arange(20, dtype=np.float32)).slice(5, 10)
    lists = pa.ListArray.from_arrays(pa.array([0, 2, 2, 7, 10], pa.int32()), values).slice(1, 3)
    batch = pa.RecordBatch.from_arrays([lists], names=["l"])
    plan = FastPlan(batch.schema, ["l"], [], [])
    data = ShardData([batch], None, plan.kernel_columns)
    slot = BufferRing(1).acquire()
    got = plan.run(plan.groups(np.array([2, 0, 1]), np.array([0, 3]), [data].__getitem__), 3,
                   slot, lambda cols: {})
    ref = lists.take(pa.array([2, 0, 1])).to_pylist()
    width = max(map(len, ref))
    assert got["l"].tolist() == [r + [0.0] * (width - len(r)) for r in ref]
    assert got["l_lengths"].tolist() == [len(r) for r in ref] == [3, 0, 5]


@pytest.mark.parametrize("t", [pa.float16(), pa.struct([("a", pa.int32())]),
                               pa.list_(pa.float32(), 3)])
def test_unsupported_columns_go_through_arrow(t: pa.DataType) -> None:
    plan = FastPlan(pa.schema([("x", t), ("y", pa.int64())]), ["x", "y"], [], [])
    assert plan.arrow_columns == ["x"] and plan.kernel_columns == ["y"]
    assert not FastPlan.supports(pa.schema([("x", t)]), ["x"], [])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), t=st.sampled_from(LISTS + [pa.list_(pa.bool_()),
                                                          pa.list_(pa.uint32())]),
       rows=st.lists(st.integers(1, 40), min_size=1, max_size=4), nulls=st.sampled_from([0, 0.3]),
       skew=st.integers(0, 3), cuts=st.lists(st.integers(0, 160), min_size=2, max_size=12))
def test_list_runs_equal_the_row_gather(seed: int, t: pa.DataType, rows: list[int],
                                        nulls: float, skew: int, cuts: list[int]) -> None:
    """copy_list_ranges (staging and record builds walk runs of rows) writes exactly what
    gather_list writes row by row, padding and nulls included, across record batches."""
    from stoker.loader.fastpath import kernels as k

    rng = np.random.default_rng(seed)
    batches = _shard([t], rows, rng, nulls, skew)
    data = ShardData(batches, None, ["c0"])
    total = int(data.starts[-1])
    bounds = sorted({min(c, total) for c in cuts} | {0, total})
    firsts = np.array(bounds[:-1], dtype=np.int64)
    ends = np.array(bounds[1:], dtype=np.int64)
    order = rng.permutation(len(firsts))  # runs land anywhere in the output, in any order
    firsts, ends = firsts[order], ends[order]
    dests = np.concatenate([[0], np.cumsum(ends - firsts)[:-1]]).astype(np.int64)
    lengths = [len(v) for b in batches for v in b.column(0).to_pylist() if v is not None]
    width = max(lengths, default=0) + 1
    dtype = np.uint8 if pa.types.is_boolean(t.value_type) else \
        np.dtype(t.value_type.to_pandas_dtype())
    got = np.full((total, width), 7, dtype=dtype)
    k.copy_list_ranges(data.views, data.meta["c0"], data.starts, firsts, ends, dests, got)
    rows_ = np.concatenate([np.arange(a, b) for a, b in zip(firsts, ends)]).astype(np.int64)
    to = np.concatenate([np.arange(d, d + b - a) for a, b, d in zip(firsts, ends, dests)])
    chunk = np.searchsorted(data.starts, rows_, side="right") - 1
    want = np.full((total, width), 7, dtype=dtype)
    k.gather_list(data.views, data.meta["c0"], chunk, rows_ - data.starts[chunk],
                  to.astype(np.int64), want)
    np.testing.assert_array_equal(got, want)  # NaN-aware, exact


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n_shards=st.integers(1, 3), nulls=st.sampled_from([0, 0.3]),
       skew=st.integers(0, 5), runs=st.lists(st.tuples(st.integers(0, 10**6), st.integers(16, 150)),
                                            min_size=1, max_size=4),
       reverse=st.booleans())
def test_runs_of_rows_match_the_reference(seed: int, n_shards: int, nulls: float, skew: int,
                                          runs: list[tuple[int, int]], reverse: bool) -> None:
    """Rows asked in runs (natural order: gather_fixed copies them tile by tile, runs cut at
    record batch and shard ends, a run's rows landing anywhere in the batch) write what the
    row-by-row reference writes, for every fixed type, nulls, casts and bools."""
    rng = np.random.default_rng(seed)
    feats = [pa.float32(), pa.int64(), pa.uint8(), pa.bool_(), pa.float64(), pa.int16()]
    cats = [pa.int64(), pa.int8(), pa.dictionary(pa.int32(), pa.string())]
    types = [pa.uint16(), pa.timestamp("ms")] + feats + cats
    shards = [_shard(types, [int(r) for r in rng.integers(20, 200, rng.integers(1, 4))], rng,
                     nulls, skew) for _ in range(n_shards)]
    names = shards[0][0].schema.names
    plan = FastPlan(shards[0][0].schema, names, names[2:2 + len(feats)], names[2 + len(feats):])
    data = [ShardData(b, None, plan.kernel_columns) for b in shards]
    sizes = [sum(b.num_rows for b in s) for s in shards]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    total = int(starts[-1])
    parts = [np.arange(lo % total, min(lo % total + n, total)) for lo, n in runs]
    ids = np.concatenate(parts[::-1] if reverse else parts).astype(np.int64)
    whole = pa.Table.from_batches([b for s in shards for b in s])
    ring = BufferRing(2)
    slot = ring.acquire()
    got = plan.run(plan.groups(ids, starts, data.__getitem__), len(ids), slot, lambda cols: {})
    ring.release(slot)
    _check(got, _reference(whole.take(pa.array(ids)), plan))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), width=st.integers(1, 70),
       kind=st.sampled_from(["float32", "int64", "uint8"]),
       sizes=st.lists(st.sampled_from([1, 63, 64, 65, 129, 192, 193, 300, 1024]), min_size=1,
                      max_size=3),
       runs=st.lists(st.tuples(st.integers(0, 10**6), st.integers(16, 700)), min_size=1,
                     max_size=3))
def test_runs_of_one_typed_matrix_match_the_reference(seed: int, width: int, kind: str,
                                                       sizes: list[int],
                                                       runs: list[tuple[int, int]]) -> None:
    """A matrix of columns all of one type without nulls (W1's features) is copied in blocks
    of rows with the next rows prefetched (kernels._rows_across): runs that start, end and
    cross block, prefetch and record batch boundaries write what the reference writes."""
    rng = np.random.default_rng(seed)
    batches = _shard([getattr(pa, kind)()] * width + [pa.int64()], sizes, rng, 0, 0)
    names = batches[0].schema.names
    plan = FastPlan(batches[0].schema, names, names[:width], [])
    data = ShardData(batches, None, plan.kernel_columns)
    total = sum(sizes)
    parts = [np.arange(lo % total, min(lo % total + n, total)) for lo, n in runs]
    ids = np.concatenate(parts).astype(np.int64)
    starts = np.array([0, total], dtype=np.int64)
    ring = BufferRing(2)
    slot = ring.acquire()
    got = plan.run(plan.groups(ids, starts, [data].__getitem__), len(ids), slot, lambda c: {})
    ring.release(slot)
    _check(got, _reference(pa.Table.from_batches(batches).take(pa.array(ids)), plan))


def test_gather_fixed_copies_runs_and_gathers_scattered_rows_alike() -> None:
    """The two ways gather_fixed writes (runs of >= 16 rows on average: tiles; else a
    column at a time) write the same bytes as the NumPy twin, with nulls; a perturbed
    value is seen."""
    from stoker.loader.fastpath import kernels as k
    from stoker.loader.fastpath import kernels_np

    rng = np.random.default_rng(3)
    batches = _shard([pa.float32(), pa.int64(), pa.bool_(), pa.uint8()], [300, 700, 50], rng,
                     0.2, 3)
    data = ShardData(batches, None, ["c0", "c1", "c2", "c3"])
    meta = data.matrix_meta(["c0", "c1", "c2", "c3"])
    for rows in (np.arange(100, 1040), np.sort(rng.choice(1050, 400, replace=False))):
        rows = rows.astype(np.int64)
        chunk = np.searchsorted(data.starts, rows, side="right") - 1
        row = rows - data.starts[chunk]
        dest = np.arange(len(rows), dtype=np.int64)
        got = np.full((len(rows), 4), np.nan)
        want = np.full((len(rows), 4), np.nan)
        k.gather_fixed(data.views, meta, chunk, row, dest, got)
        kernels_np.gather_fixed(data.views, meta, chunk, row, dest, want)
        np.testing.assert_array_equal(got, want)
        want[len(rows) // 2, 0] += 1
        assert not np.array_equal(got, want, equal_nan=True)
