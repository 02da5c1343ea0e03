"""Cold start: batches read while the kernels compile (their NumPy twins,
stoker.loader.fastpath.kernels_np) are byte for byte the batches the kernels give, and switching from
one to the other in the middle of an epoch changes no byte."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))  # for fastpath_helpers (importlib mode)

from fastpath_helpers import random_array  # noqa: E402

from stoker.loader import DataLoader, ReadOptions, WorkerOptions  # noqa: E402
from stoker.loader.fastpath import warm  # noqa: E402
from stoker.loader.jit import warmup  # noqa: E402

from stoker.loader.fastpath import kernels

from stoker.loader.fastpath import kernels_np
from stoker.loader.fastpath.plan import FastPlan, ShardData  # noqa: E402
from stoker.loader.fastpath.record_table import RecordTable  # noqa: E402
from stoker.loader.fastpath.ring import BufferRing  # noqa: E402

FIXED = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(),
         pa.uint64(), pa.float32(), pa.float64(), pa.bool_(), pa.date32(), pa.timestamp("ms"),
         pa.dictionary(pa.int32(), pa.string())]
LISTS = [pa.list_(pa.float32()), pa.large_list(pa.int16()), pa.list_(pa.float64()),
         pa.list_(pa.bool_()), pa.list_(pa.uint64())]
VARS = [pa.binary(), pa.large_binary(), pa.string()]
NUMERIC = [pa.float32(), pa.float64(), pa.int8(), pa.int16(), pa.int32(), pa.int64(),
           pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64(), pa.bool_()]
CATEGORICAL = [pa.int64(), pa.int8(), pa.uint32(), pa.dictionary(pa.int32(), pa.string())]


def _raw(value: Any) -> Any:
    """What a batch value is, byte for byte (tensors: dtype, shape and bytes)."""
    if isinstance(value, torch.Tensor):
        return str(value.dtype), tuple(value.shape), value.numpy().tobytes()
    return value


def _assert_same_bytes(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert list(a) == list(b)
    for key in a:
        assert _raw(a[key]) == _raw(b[key]), key


def _run(plan: FastPlan, groups: list[Any], n: int, which: Any) -> dict[str, Any]:
    slot = BufferRing(1).acquire()
    batch = plan.run(groups, n, slot, lambda cols: {}, kernels=which)
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n_cols=st.integers(1, 6), n_shards=st.integers(1, 3),
       nulls=st.sampled_from([0.0, 0.3]), skew=st.integers(0, 9), batch=st.integers(1, 60),
       n_features=st.integers(0, 4), n_cats=st.integers(0, 3))
def test_twins_write_the_kernels_bytes(seed: int, n_cols: int, n_shards: int, nulls: float,
                                       skew: int, batch: int, n_features: int,
                                       n_cats: int) -> None:
    """Every column type and output kind the fast path supports: fixed-width (every physical
    type, temporal, dictionary), lists, binary and strings, stacked features (float32) and
    categoricals (int64), with and without nulls, sliced arrays, repeated ids."""
    rng = np.random.default_rng(seed)
    pool = FIXED + LISTS + VARS
    types = [pool[i] for i in rng.integers(0, len(pool), n_cols)]
    feats = [NUMERIC[i] for i in rng.integers(0, len(NUMERIC), n_features)]
    cats = [CATEGORICAL[i] for i in rng.integers(0, len(CATEGORICAL), n_cats)]
    all_types = types + feats + cats
    names = [f"c{i}" for i in range(len(all_types))]
    shards = []
    for _ in range(n_shards):
        batches = []
        for n in rng.integers(1, 12, rng.integers(1, 4)).tolist():
            arrays = [random_array(t, n + skew, rng, nulls).slice(skew, n) for t in all_types]
            batches.append(pa.RecordBatch.from_arrays(arrays, names=names))
        shards.append(batches)
    plan = FastPlan(shards[0][0].schema, names, names[n_cols:n_cols + n_features],
                    names[n_cols + n_features:])
    data = [ShardData(b, None, plan.kernel_columns) for b in shards]
    sizes = [sum(b.num_rows for b in s) for s in shards]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    ids = rng.integers(0, starts[-1], batch)
    groups = plan.groups(ids, starts, data.__getitem__)
    _assert_same_bytes(_run(plan, groups, batch, kernels_np), _run(plan, groups, batch, kernels))


def test_twins_cast_extreme_values_as_the_kernels_do() -> None:
    """Casts to float32 features and int64 categoricals at the edges: rounding of large
    integers, float64 beyond float32's range, subnormals, -0.0, infinities, NaN payloads."""
    u64 = np.array([0, 1, 2**24 + 1, 2**53 + 1, 2**63 - 1, 2**63, 2**63 + 2**39 + 1,
                    2**64 - 1], dtype=np.uint64)
    i64 = np.array([0, -1, 2**24 + 1, -(2**53) - 1, 2**63 - 1, -(2**63), 2**62 + 2**38 + 1,
                    -(2**62) - 2**38 - 1], dtype=np.int64)
    f64 = np.array([0.0, -0.0, 1e-320, 3.5e38, -1e39, np.inf, np.nan, 1 + 2**-30])
    f64[6] = np.frombuffer(np.uint64(0x7FF8000000000123).tobytes(), np.float64)[0]
    table = pa.record_batch({"u": u64, "i": i64, "f": f64, "u32": u64.astype(np.uint32),
                             "k": i64, "ku": u64.astype(np.uint32)})
    plan = FastPlan(table.schema, table.schema.names, ["u", "i", "f", "u32"], ["k", "ku"])
    data = ShardData([table], None, plan.kernel_columns)
    ids = np.arange(len(u64))[::-1].copy()
    groups = plan.groups(ids, np.array([0, len(u64)]), [data].__getitem__)
    _assert_same_bytes(_run(plan, groups, len(ids), kernels_np),
                       _run(plan, groups, len(ids), kernels))


class _Gate:
    """``warm.ready`` that answers "compiling" for the first ``closed`` batches."""

    def __init__(self, closed: int) -> None:
        self.closed, self.calls = closed, 0

    def __call__(self, *args: Any) -> bool:
        self.calls += 1
        return self.calls > self.closed


def _epoch(root: Path, monkeypatch: pytest.MonkeyPatch, gate: Callable[..., bool] | None,
           **kw: Any) -> tuple[list[dict[str, Any]], Any]:
    if gate is not None:
        monkeypatch.setattr(warm, "ready", gate)
    loader = DataLoader(root, batch_size=8, seed=3, **kw)
    try:
        batches = [{k: _raw(v) for k, v in b.items()} for b in loader]
        return batches, loader.stats
    finally:
        loader.close()
        monkeypatch.undo()


OPTIONS = [
    dict(),  # every column: fixed, dictionary, bool, list, binary, string, struct (pyarrow)
    dict(read=ReadOptions(features=["f0", "f1", "f2", "flag"], categoricals=["c0", "c1"])),
    dict(read=ReadOptions(features=["f0", "f1"], categoricals=["c0"]),
         columns=["seq", "blob", "name"]),
    dict(read=ReadOptions(features=["f0", "f1", "f2"], row_major=False), columns=["id", "seq"]),
    dict(read=ReadOptions(features=["f0", "f1", "f2"], categoricals=["c0", "c1"], row_major=True),
         columns=["id"]),
    dict(read=ReadOptions(features=["f0", "f1", "f2"], categoricals=["c0", "c1"],
                          row_major="staged"), columns=["id", "seq"]),
]


@pytest.mark.parametrize("options", OPTIONS, ids=[str(i) for i in range(len(OPTIONS))])
@pytest.mark.parametrize("shuffle", [True, False])
def test_switching_mid_epoch_changes_no_byte(mixed_dataset: Path, monkeypatch: pytest.MonkeyPatch,
                                            options: dict[str, Any], shuffle: bool) -> None:
    """Batches 0-5 read while 'compiling', the rest by the kernels: the same bytes as an epoch
    read by the kernels alone, one switch and six "compiling" fallbacks counted (batches
    read one by one, in this thread: a reader thread reads groups of them,
    test_thread_workers_switch_without_changing_bytes)."""
    one_by_one = WorkerOptions(read_ahead=False)
    want, plain = _epoch(mixed_dataset, monkeypatch, None, shuffle=shuffle, workers=one_by_one,
                         **options)
    got, stats = _epoch(mixed_dataset, monkeypatch, _Gate(6), shuffle=shuffle,
                        workers=one_by_one, **options)
    assert len(got) == len(want) == 14
    for a, b in zip(got, want):
        assert a == b
    assert stats.fallbacks.get("compiling") == 6 and stats.kernel_switches == 1
    assert "compiling" not in plain.fallbacks and plain.kernel_switches == 0
    assert stats.as_dict()["kernel_switches"] == 1


@pytest.mark.parametrize("workers,row_major", [(2, "auto"), (0, "auto"), (0, True)])
def test_thread_workers_switch_without_changing_bytes(mixed_dataset: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      workers: int, row_major: bool | str
                                                      ) -> None:
    """Thread workers, or with ``num_workers=0`` the reader thread (groups of batches where
    records serve them: ``row_major=True``; a group asks once whether the kernels are
    ready), switch without changing a byte."""
    kw = dict(read=ReadOptions(features=["f0", "f1", "f2", "flag"], categoricals=["c0", "c1"],
                               row_major=row_major), shuffle=True, num_workers=workers)
    want, _ = _epoch(mixed_dataset, monkeypatch, None, **kw)
    got, stats = _epoch(mixed_dataset, monkeypatch, _Gate(5), **kw)
    assert got == want
    compiling = stats.fallbacks.get("compiling", 0)
    assert (compiling == 5 if workers else 1 <= compiling <= 5) and stats.kernel_switches >= 1


@pytest.mark.parametrize("served_by", ["columns", "records"])
def test_a_perturbed_twin_is_caught(mixed_dataset: Path, monkeypatch: pytest.MonkeyPatch,
                                    served_by: str) -> None:
    """The comparison above fails when the twins write one different value: the column
    kernels' twins, or the records gather's (which serves shards whose records the node
    stored: ``row_major=True`` builds and saves every shard's on the first epoch)."""
    kw = dict(read=ReadOptions(features=["f0", "f1", "f2", "flag"], categoricals=["c0", "c1"],
                               row_major=served_by == "records"), shuffle=True)
    want, _ = _epoch(mixed_dataset, monkeypatch, None, **kw)
    if served_by == "columns":
        original = kernels_np.gather_fixed

        def off_by_one(views: Any, meta: Any, chunk: Any, row: Any, dest: Any, out: Any) -> None:
            original(views, meta, chunk, row, dest, out)
            if len(dest):
                out[dest[0], 0] += 1

        monkeypatch.setattr(kernels_np, "gather_fixed", off_by_one)
    else:
        gather = RecordTable._gather_numpy

        def one_byte_off(self: RecordTable, ids: Any, starts: Any, fields: Any,
                         outs: Any) -> Any:
            got = gather(self, ids, starts, fields, outs)
            outs[0][0, 0] += 1
            return got

        monkeypatch.setattr(RecordTable, "_gather_numpy", one_byte_off)
    got, _ = _epoch(mixed_dataset, monkeypatch, _Gate(1), **kw)
    assert got != want and got[1:] == want[1:]


def test_ready_waits_for_the_plans_warm_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan is ready once its warm-up finished (however it ended), and always under
    STOKER_COLD_START=wait; a process that never started it (a forked or unpickled worker)
    starts it at its first batch."""
    started: list[tuple[str, ...]] = []
    monkeypatch.setattr(warmup, "_finished", set())
    monkeypatch.setattr(warmup, "_done", set())
    monkeypatch.setattr(warm, "start", lambda plan, schema, rm: started.append(("k",)))
    monkeypatch.setenv("STOKER_COLD_START", "fallback")
    monkeypatch.setattr(warm, "_warm", [False])  # a node that never compiled the kernels
    assert not warm.ready(("k",), None, None, False)  # type: ignore[arg-type]
    assert started == [("k",)]
    warmup._finished.add(("k",))
    assert warm.ready(("k",), None, None, False)  # type: ignore[arg-type]
    monkeypatch.setattr(warm, "_warm", [True])  # kernels in the cache: load, not twins
    assert warm.ready(("other",), None, None, False)  # type: ignore[arg-type]
    monkeypatch.setattr(warm, "_warm", [False])
    monkeypatch.setenv("STOKER_COLD_START", "wait")
    assert warm.ready(("other",), None, None, False)  # type: ignore[arg-type]


def test_a_forked_child_restarts_unfinished_warm_ups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warmup, "_finished", {("done",)})
    monkeypatch.setattr(warmup, "_done", {("done",), ("half",)})
    warmup._before_fork()
    warmup._after_fork_in_child()
    assert warmup._done == {("done",)} and not warmup._held_for_fork
    lock = warmup._compiler_lock()
    # not left held (a warm-up thread of an earlier test may be compiling: wait for it)
    assert lock is not None and lock._lock.acquire(timeout=120)
    lock._lock.release()


@pytest.mark.parametrize("nulls", [0.0, 0.3])
@pytest.mark.parametrize("kind", [pa.binary(), pa.large_binary(), pa.string()])
def test_twins_write_long_binary_values_as_the_kernels_do(kind: pa.DataType,
                                                          nulls: float) -> None:
    """Values longer than ``kernels_np._SLICED`` bytes on average (images) are copied a
    slice each by the twin: the same bytes as the kernel, nulls and empty values included."""
    rng = np.random.default_rng(5)
    shards = []
    for n in (40, 25):
        values = [None if rng.random() < nulls else
                  "".join(chr(97 + c) for c in rng.integers(0, 26, rng.integers(0, 400)))
                  for _ in range(n + 3)]
        raw = values if kind == pa.string() else \
            [None if v is None else v.encode() for v in values]
        shards.append([pa.RecordBatch.from_arrays([pa.array(raw, kind).slice(3, n)],
                                                  names=["b"])])
    plan = FastPlan(shards[0][0].schema, ["b"], [], [])
    data = [ShardData(b, None, plan.kernel_columns) for b in shards]
    starts = np.array([0, 40, 65], dtype=np.int64)
    ids = rng.integers(0, 65, 50)
    groups = plan.groups(ids, starts, data.__getitem__)
    _assert_same_bytes(_run(plan, groups, 50, kernels_np), _run(plan, groups, 50, kernels))
