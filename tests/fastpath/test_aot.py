"""Kernels compiled ahead of time (stoker.loader.jit.aot): the bytes of the JIT kernels, loaded
without Numba, never a stale or broken module; and a process reading stored records through
them never imports Numba and reads the batches the JIT kernels give."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))  # for fastpath_helpers (importlib mode)

from fastpath_helpers import record_table, write_dataset  # noqa: E402

from stoker.loader.fallbacks import collecting  # noqa: E402
from stoker.loader.fastpath import kernels, kernels_np, rowmajor  # noqa: E402
from stoker.loader.fastpath import record_table as rt  # noqa: E402
from stoker.loader.fastpath.plan import FastPlan, ShardData  # noqa: E402
from stoker.loader.fastpath.ring import BufferRing  # noqa: E402
from stoker.loader.fastpath.rowmajor import Field, RecordLayout  # noqa: E402
from stoker.loader.jit import aot  # noqa: E402
from stoker.loader.order import feistel  # noqa: E402
from stoker.loader.order.epoch import EpochOrder  # noqa: E402
from stoker.loader.order.options import OrderOptions  # noqa: E402
from stoker.tools.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A directory holding the module for this code (built once: ~5-8 s of one core)."""
    root = str(tmp_path_factory.mktemp("aot"))
    path = aot.build(root)
    assert path is not None and os.path.exists(path) and path == aot.module_path(root)[1]
    return root


@pytest.fixture
def on(built: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Ahead-of-time kernels on, from ``built``, looked for afresh in this process."""
    monkeypatch.setenv("STOKER_AOT", "on")
    monkeypatch.setenv("STOKER_AOT_DIR", built)
    monkeypatch.setattr(aot, "_loaded", [])
    yield built
    aot._loaded.clear()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=6),
       seed=st.integers(0, 2**32 - 1), epoch=st.integers(0, 5),
       partitions=st.sampled_from([1, 2, 7, 32]), block=st.sampled_from([1, 3, 16, 64]),
       window=st.tuples(st.integers(0, 20000), st.integers(0, 20000), st.integers(1, 9)))
def test_the_order_compiled_ahead_of_time_gives_the_jit_ids(on: str, sizes: list[int],
                                                           seed: int, epoch: int,
                                                           partitions: int, block: int,
                                                           window: tuple[int, int, int]) -> None:
    if not sum(sizes):
        sizes = [*sizes, 1]
    order = EpochOrder(np.array(sizes, dtype=np.int64), "ab" * 16, seed, epoch,
                       OrderOptions(partitions=partitions, block_size=block))
    n = order.num_samples
    start, stop, step = min(window[0], n), min(window[1], n), window[2]
    args = (np.int64(start), np.int64(stop), np.int64(step), *order._kernel_args())
    ahead = aot.function("order_range")
    assert ahead is not None
    got, want = ahead(*args), feistel.order_range(*args)
    assert got.dtype == want.dtype == np.int64 and np.array_equal(got, want)


def _gather(table: rt.RecordTable, ids: np.ndarray, starts: np.ndarray) -> list[Any]:
    slot = BufferRing(1).acquire()
    arrays, missing, touched = table.gather(ids, starts, slot, kernel=True)
    return [{k: v.copy() for k, v in arrays.items()}, missing.copy(), touched.copy()]


def test_the_records_gather_compiled_ahead_of_time_writes_the_jit_bytes(
        on: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    layout = RecordLayout([Field("features", "matrix", 0, 5, np.dtype(np.float32), ()),
                           Field("label", "fixed", 24, 1, np.dtype(np.int64), ())])
    rows = [300, 0, 120, 77]
    starts = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
    table = rt.RecordTable(layout, len(rows))
    for shard in (0, 3):  # shard 2 has no records: its rows come back as missing
        table.add(shard, rng.integers(0, 255, (rows[shard], layout.stride), dtype=np.uint8))
    ids = rng.integers(0, int(starts[-1]), 700).astype(np.int64)
    assert aot.function("record_gather") is not None
    with monkeypatch.context() as patched:  # as if this process had not loaded the JIT one
        patched.setattr(rt, "compiled", lambda fn: False)
        ahead = _gather(table, ids, starts)
    monkeypatch.setattr(aot, "_loaded", [None])  # the JIT kernel
    jit = _gather(table, ids, starts)
    assert rt.compiled(rt._gather)
    assert np.array_equal(ahead[1], jit[1]) and len(jit[1])  # rows of shard 2: left unwritten
    assert np.array_equal(ahead[2], jit[2])
    written = np.setdiff1d(np.arange(len(ids)), jit[1])
    assert ahead[0].keys() == jit[0].keys()
    for name in jit[0]:
        assert ahead[0][name][written].tobytes() == jit[0][name][written].tobytes(), name


@pytest.mark.parametrize("rows", [0, 1, 257, 1000])
def test_the_transpose_compiled_ahead_of_time_writes_the_jit_bytes(on: str, rows: int) -> None:
    """``columns_to_records`` (plain indexed row groups made row-major): 1-, 2-, 4- and
    8-byte values and a whole list row, at offsets that do and do not allow word moves."""
    rng = np.random.default_rng(rows)
    columns = [rng.integers(0, 255, rows, np.uint8), rng.integers(-9, 9, rows, np.int16),
               rng.standard_normal(rows).astype(np.float32), rng.integers(-9, 9, rows),
               rng.standard_normal((rows, 3)).astype(np.float32), rng.standard_normal(rows)]
    offsets = np.array([0, 1, 4, 8, 16, 29], np.int64)  # the last 8-byte value is unaligned
    sizes = np.array([c.itemsize * (c.shape[1] if c.ndim == 2 else 1) for c in columns],
                     np.int64)
    addrs = np.array([c.ctypes.data for c in columns], np.int64)
    stride = 40
    got, want = (np.zeros((rows, stride), np.uint8) for _ in range(2))
    ahead = aot.function("columns_to_records")
    assert ahead is not None
    ahead(addrs, sizes, offsets, rows, 256, got.ctypes.data, stride)
    kernels.columns_to_records(addrs, sizes, offsets, rows, 256, want.ctypes.data, stride)
    assert got.tobytes() == want.tobytes()
    for column, o, size in zip(columns, offsets, sizes):  # every column's own bytes
        assert want[:, o:o + size].tobytes() == np.ascontiguousarray(column).tobytes()
    if rows:
        got[rows - 1, 29] ^= 1
        assert got.tobytes() != want.tobytes()


def _every_builder_table(n: int, seed: int) -> pa.Table:
    """Record fields of every dtype the builders are exported for: features (float32),
    categoricals (int64), fixed-width columns and fixed-length lists of each, with nulls."""
    rng = np.random.default_rng(seed)
    table = {"f0": pa.array(rng.standard_normal(n).astype(np.float32), mask=rng.random(n) < 0.1),
             "f1": pa.array(rng.integers(-50, 50, n).astype(np.int16)),
             "c0": pa.array(rng.integers(0, 9, n).astype(np.int32), mask=rng.random(n) < 0.1)}
    for dtype in aot.DTYPES:
        values = (rng.standard_normal(n * 3) * 1e3).astype(dtype)
        table[f"x_{dtype}"] = pa.array(values[:n], mask=rng.random(n) < 0.1)
        child = pa.array(values, mask=rng.random(n * 3) < 0.1)  # null values: written as 0
        table[f"seq_{dtype}"] = pa.ListArray.from_arrays(np.arange(0, n * 3 + 1, 3, dtype=np.int32),
                                                         child)
    return pa.table(table)


def test_the_record_builders_compiled_ahead_of_time_write_the_jit_bytes(
        on: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = _every_builder_table(700, 5)
    manifest = write_dataset(tmp_path / "data", [table], batch_rows=64)
    columns = [c for c in table.column_names if c not in ("f0", "f1", "c0")]
    plan = FastPlan(manifest.arrow_schema, ["f0", "f1", "c0", *columns], ["f0", "f1"], ["c0"])
    source = pa.memory_map(str(Path(manifest.root) / manifest.shards[0].path), "r")
    arena = source.read_buffer(source.size())
    batches = pa.ipc.open_file(arena).read_all().to_batches()
    layout = RecordLayout.of(plan, batches)
    assert layout is not None and len(layout.fields) == 2 + 2 * len(aot.DTYPES)
    asked: list[str] = []
    real = aot.function
    monkeypatch.setattr(aot, "function", lambda name: asked.append(name) or real(name))
    with monkeypatch.context() as patched:  # as if this process had not loaded the JIT ones
        patched.setattr(aot, "compiled", lambda fn: False)
        ahead = rowmajor.build(layout, ShardData(batches, arena, plan.kernel_columns))
    wanted = {f"{kind}_{t}" for kind in ("copy_ranges", "copy_list_ranges")
              for t in aot.DTYPES}
    assert set(asked) == wanted and all(real(name) is not None for name in wanted)
    monkeypatch.setattr(aot, "_loaded", [None])  # the JIT kernels
    jit = rowmajor.build(layout, ShardData(batches, arena, plan.kernel_columns))
    assert aot.compiled(kernels.copy_ranges) and aot.compiled(kernels.copy_list_ranges)
    assert ahead.shape == jit.shape and ahead.tobytes() == jit.tobytes()


@pytest.mark.parametrize("contiguous", [True, False], ids=["shuffled rows", "index views"])
def test_the_column_gathers_compiled_ahead_of_time_write_the_jit_bytes(
        on: str, tmp_path: Path, contiguous: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """kernels_np.ahead, what a batch runs without Numba: every output dtype, nulls, lists;
    where the index arrays are not C-contiguous (strided views) its NumPy twins serve, with
    the same bytes."""
    served: list[str] = []
    real = aot.function
    monkeypatch.setattr(aot, "function",
                        lambda name: (fn := real(name)) and (served.append(name) or fn))
    table = _every_builder_table(700, 8)
    manifest = write_dataset(tmp_path / "data", [table], batch_rows=64)
    columns = [c for c in table.column_names if c not in ("f0", "f1", "c0")]
    plan = FastPlan(manifest.arrow_schema, ["f0", "f1", "c0", *columns], ["f0", "f1"], ["c0"])
    assert kernels_np.ahead.covers(plan)
    source = pa.memory_map(str(Path(manifest.root) / manifest.shards[0].path), "r")
    arena = source.read_buffer(source.size())
    data = ShardData(pa.ipc.open_file(arena).read_all().to_batches(), arena,
                     plan.kernel_columns)
    ids = np.random.default_rng(1).integers(0, 700, 300).astype(np.int64)
    starts = np.array([0, 700], dtype=np.int64)
    groups = plan.groups(ids, starts, lambda index: data)
    if not contiguous:
        groups = [(d, np.repeat(c, 2)[::2], np.repeat(r, 2)[::2], np.repeat(t, 2)[::2])
                  for d, c, r, t in groups]
        assert not groups[0][1].flags.c_contiguous
    got = {}
    for name, impl in (("ahead", kernels_np.ahead), ("jit", kernels)):
        served.clear()
        batch = plan.run(groups, len(ids), BufferRing(1).acquire(), dict, kernels=impl)
        got[name] = {key: value.numpy().copy() for key, value in batch.items()}
        if name == "ahead":
            wanted = {f"gather_{kind}_{t}" for kind in ("fixed", "list") for t in aot.DTYPES}
            assert set(served) == (wanted | {"var_lengths"} if contiguous else set())
    assert got["ahead"].keys() == got["jit"].keys() and len(got["jit"]) == 10
    for key, value in got["jit"].items():
        assert got["ahead"][key].dtype == value.dtype and \
            got["ahead"][key].tobytes() == value.tobytes(), key


def test_another_code_or_a_broken_file_is_never_loaded(built: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOKER_AOT", "on")
    monkeypatch.setenv("STOKER_AOT_DIR", built)
    monkeypatch.setattr(aot, "_loaded", [])
    built_path = aot.module_path(built)[1]
    monkeypatch.setattr(aot, "_FORMAT", "another code")  # what an edit or upgrade changes
    assert aot.module_path(built)[1] != built_path
    assert not os.path.exists(aot.module_path(built)[1])
    assert aot.function("record_gather") is None  # the built module is for other code

    monkeypatch.setenv("STOKER_AOT_DIR", str(tmp_path))
    monkeypatch.setattr(aot, "_loaded", [])
    Path(aot.module_path()[1]).write_bytes(b"\x7fELF torn")
    with collecting() as noted:
        assert aot.function("order_range") is None
    assert "aot_unusable" in noted

    monkeypatch.setenv("STOKER_AOT", "off")
    monkeypatch.setattr(aot, "_loaded", [])
    monkeypatch.setenv("STOKER_AOT_DIR", built)
    monkeypatch.setattr(aot, "_FORMAT", aot._FORMAT)
    assert aot.function("order_range") is None and not aot.build_in_background()


_EPOCH = """
import hashlib, json, os, sys
from stoker.loader import DataLoader, ReadOptions, WorkerOptions
loader = DataLoader(sys.argv[1], batch_size=16, shuffle=os.environ.get("SHUFFLE", "1") == "1",
                    seed=4, columns=["id", "seq"], num_workers=int(sys.argv[2]),
                    workers=WorkerOptions(mode=os.environ.get("WORKER_MODE", "thread")),
                    read=ReadOptions(features=["f0", "f1"], categoricals=["c0"],
                                     row_major={"on": True, "off": False}.get(
                                         os.environ.get("ROW_MAJOR", "on"),
                                         os.environ.get("ROW_MAJOR"))))
h = hashlib.sha256()
for batch in loader:
    for key in sorted(batch):
        h.update(key.encode() + batch[key].numpy().tobytes())
loader._source.wait_row_major()  # every record saved: the next run finds them all
loader.close()
print(json.dumps({"digest": h.hexdigest(), "numba": "numba" in sys.modules,
                  "numpy_ma": "numpy.ma" in sys.modules,
                  "fallbacks": dict(loader.stats.fallbacks)}))
"""


@pytest.fixture
def three_shards(tmp_path: Path) -> Path:
    """A dataset of three shards whose outputs all fit row-major records."""
    sizes = [300, 200, 250]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    manifest = write_dataset(tmp_path / "data", [record_table(n, int(s), i) for i, (n, s)
                                                 in enumerate(zip(sizes, starts))],
                             batch_rows=32)
    return Path(manifest.root)


def _run(script: str, root: Path, records: Path, workers: int = 0, **env: str
         ) -> dict[str, Any]:
    """``script`` in a fresh process over ``root``, its records in ``records``: its JSON."""
    out = subprocess.run([sys.executable, "-c", script, str(root), str(workers)], check=True,
                         text=True, capture_output=True,
                         env={**os.environ, "STOKER_ROW_MAJOR_DIR": str(records), **env})
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("workers,mode", [(0, "thread"), (2, "thread"), (2, "process")],
                         ids=["no workers", "2 thread workers", "2 process workers"])
def test_a_run_of_stored_records_never_imports_numba(built: str, tmp_path: Path,
                                                     three_shards: Path, workers: int,
                                                     mode: str) -> None:
    """Nor does the consumer of process workers import it before forking them (Numba's
    import is a fork-gate unit instead: stoker.loader.jit.kernel.materialize). Without
    workers nothing imports ``numpy.ma`` either (``np.unique``'s first call does: ~10-18 ms
    of the first batch; a consumer of process workers imports it before forking them, on
    purpose: stoker.loader.workers.processes)."""
    records = tmp_path / "records"
    first = _run(_EPOCH, three_shards, records, STOKER_AOT="off")  # builds, saves
    assert first["numba"]
    ahead = _run(_EPOCH, three_shards, records, workers, STOKER_AOT="on",
                 STOKER_AOT_DIR=built, STOKER_COLD_START="fallback", WORKER_MODE=mode)
    assert not ahead["numba"] and ahead["digest"] == first["digest"]
    assert "compiling" not in ahead["fallbacks"]
    assert ahead["numpy_ma"] == (mode == "process")
    jit = _run(_EPOCH, three_shards, records, STOKER_AOT="off")  # the stored records
    assert jit["numba"] and jit["digest"] == first["digest"]


def test_staged_rounds_read_the_same_batches_with_the_kernels_compiled_ahead_of_time(
        built: str, tmp_path: Path, three_shards: Path) -> None:
    """Rounds staged (``row_major="staged"``, as past memory) where the node has the module:
    copied (``copy_ranges``, ``copy_list_ranges``) and gathered (``record_gather``) without
    importing Numba, the batches of a run without it, and of per-shard records."""
    ahead = {"STOKER_AOT": "on", "STOKER_AOT_DIR": built, "STOKER_COLD_START": "fallback"}
    jit = _run(_EPOCH, three_shards, tmp_path / "jit", STOKER_AOT="off", ROW_MAJOR="staged")
    staged = _run(_EPOCH, three_shards, tmp_path / "ahead", ROW_MAJOR="staged", **ahead)
    records = _run(_EPOCH, three_shards, tmp_path / "records", **ahead)
    assert staged["digest"] == jit["digest"] == records["digest"]
    assert jit["numba"] and not staged["numba"] and not staged["fallbacks"]


@pytest.mark.parametrize("workers,shuffle", [(0, "1"), (2, "1"), (0, "0")],
                         ids=["shuffled", "shuffled, 2 thread workers", "natural order"])
def test_a_nodes_first_run_builds_its_records_without_numba(built: str, tmp_path: Path,
                                                           three_shards: Path, workers: int,
                                                           shuffle: str) -> None:
    """No records stored yet, the kernels compiled ahead of time: the run builds and saves
    every shard's records and gathers the rows without records from the columns without
    importing Numba (its start-up would hold the GIL against the shard opens and the
    builds), reads the batches of a JIT run, and a later run maps what it saved."""
    jit = _run(_EPOCH, three_shards, tmp_path / "jit", STOKER_AOT="off", SHUFFLE=shuffle)
    records = tmp_path / "records"
    ahead = {"STOKER_AOT": "on", "STOKER_AOT_DIR": built, "STOKER_COLD_START": "fallback",
             "SHUFFLE": shuffle}
    first = _run(_EPOCH, three_shards, records, workers, **ahead)
    assert first["digest"] == jit["digest"] and not first["numba"]
    assert "compiling" not in first["fallbacks"]
    assert len(list(records.glob("*.rec"))) == 3 == len(list((tmp_path / "jit").glob("*.rec")))
    assert sorted(p.read_bytes() for p in records.glob("*.rec")) == \
        sorted(p.read_bytes() for p in (tmp_path / "jit").glob("*.rec"))
    later = _run(_EPOCH, three_shards, records, **ahead)
    assert later["digest"] == jit["digest"] and not later["numba"]


@pytest.mark.parametrize("workers,mode,shuffle", [(0, "thread", "0"), (0, "thread", "1"),
                                                   (2, "process", "0")],
                         ids=["natural order", "shuffled", "2 process workers"])
def test_columns_alone_are_gathered_without_numba(built: str, tmp_path: Path,
                                                  three_shards: Path, workers: int, mode: str,
                                                  shuffle: str) -> None:
    """``row_major=False`` on a node with the module: every batch is gathered from the
    columns by the gathers compiled ahead of time, the JIT run's bytes, and no process
    imports Numba (on a node whose Numba cache was warm, loading the JIT gathers held the
    first batch 0.4 s)."""
    env = {"ROW_MAJOR": "off", "SHUFFLE": shuffle}
    jit = _run(_EPOCH, three_shards, tmp_path / "jit", STOKER_AOT="off", **env)
    ahead = _run(_EPOCH, three_shards, tmp_path / "ahead", workers, STOKER_AOT="on",
                 STOKER_AOT_DIR=built, STOKER_COLD_START="fallback", WORKER_MODE=mode, **env)
    assert ahead["digest"] == jit["digest"] and jit["numba"] and not ahead["numba"]
    assert "compiling" not in ahead["fallbacks"]
    assert not list((tmp_path / "ahead").glob("*.rec"))


def _plain_parquet(root: Path) -> Path:
    """Two Parquet files (130 and 90 rows, row groups of 40) whose columns are all plain
    (no nulls, no casts: stoker.loader.read.indexed.row_groups.plain_records), indexed in
    place."""
    rng = np.random.default_rng(5)
    root.mkdir()
    for name, n, start in (("a.parquet", 130, 0), ("b.parquet", 90, 130)):
        seq = pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(n * 3, np.float32)), 3)
        pq.write_table(pa.table({"id": np.arange(start, start + n),
                                 "f0": rng.standard_normal(n, np.float32),
                                 "f1": rng.standard_normal(n, np.float32),
                                 "c0": rng.integers(0, 9, n), "seq": seq.cast(pa.list_(pa.float32()))}),
                       root / name, row_group_size=40)
    assert main(["index", str(root), "--quiet"]) == 0
    return root


@pytest.mark.parametrize("shuffle", ["1", "0"], ids=["shuffled (staged rounds)", "natural order"])
def test_indexed_parquet_is_read_without_numba(built: str, tmp_path: Path, shuffle: str) -> None:
    """Parquet indexed in place, the kernels compiled ahead of time: a node's first run
    decodes the row groups and makes them row-major (``columns_to_records``), gathers staged
    rounds (``record_gather``) and saves the groups' records without importing Numba, and
    reads the batches of a run without the module; so does a later run mapping them."""
    root = _plain_parquet(tmp_path / "data")
    jit = _run(_EPOCH, root, tmp_path / "jit", STOKER_AOT="off", SHUFFLE=shuffle)
    assert jit["numba"] or shuffle == "0"  # natural order loads the kernel only past 4 M rows
    ahead = {"STOKER_AOT": "on", "STOKER_AOT_DIR": built, "STOKER_COLD_START": "fallback",
             "SHUFFLE": shuffle}
    records = tmp_path / "records"
    first = _run(_EPOCH, root, records, **ahead)
    assert first["digest"] == jit["digest"] and not first["numba"] and not first["fallbacks"]
    assert len(list(records.glob("*.rec"))) == 7  # every row group's records saved
    later = _run(_EPOCH, root, records, **ahead)
    assert later["digest"] == jit["digest"] and not later["numba"]


_EPOCHS = """
import hashlib, json, sys
from stoker.loader import DataLoader, ReadOptions, WorkerOptions
from stoker.loader.jit import aot
asked = []
real = aot.function
aot.function = lambda name: asked.append(name) or real(name)
loader = DataLoader(sys.argv[1], batch_size=16, shuffle=True, seed=4, columns=["id", "seq"],
                    num_workers=int(sys.argv[2]), persistent_workers=int(sys.argv[2]) > 0,
                    read=ReadOptions(features=["f0", "f1"], categoricals=["c0"], row_major=True),
                    workers=WorkerOptions(mode="thread"))
digests, asks = [], []
for epoch in range(2):
    loader.set_epoch(epoch)
    asked.clear()
    h = hashlib.sha256()
    for batch in loader:
        for key in sorted(batch):
            h.update(key.encode() + batch[key].numpy().tobytes())
    digests.append(h.hexdigest())
    # the kernels compiled ahead of time asked for: the gather's, the order's
    asks.append([asked.count("record_gather"), asked.count("order_range")])
loader._source.wait_row_major()
loader.close()
print(json.dumps({"digests": digests, "asked": asks, "numba": "numba" in sys.modules,
                  "grouped": loader._source.batches_grouped}))
"""


def test_thread_workers_read_stored_records_without_numba_over_epochs(
        built: str, tmp_path: Path, three_shards: Path) -> None:
    """Thread workers serve every group of both epochs through the gather compiled ahead of
    time (it gives the GIL up, so they never load its JIT twin) and give the bytes of a run
    that never had the module."""
    records = tmp_path / "records"
    ahead = {"STOKER_AOT": "on", "STOKER_AOT_DIR": built, "STOKER_COLD_START": "fallback"}
    jit = _run(_EPOCHS, three_shards, records, STOKER_AOT="off")  # builds, saves; JIT only
    assert jit["digests"][0] != jit["digests"][1]  # two epochs, two orders
    assert jit["numba"]
    threads = _run(_EPOCHS, three_shards, records, 2, **ahead)
    assert threads["digests"] == jit["digests"]
    assert threads["grouped"] > 0 and not threads["numba"]
    assert min(threads["asked"][0]) > 0
    alone = _run(_EPOCHS, three_shards, records, **ahead)
    assert alone["digests"] == jit["digests"] and not alone["numba"]


_GIL = """
import json, sys, threading
import numpy as np
from stoker.loader.jit import aot
from stoker.loader.order.epoch import EpochOrder
from stoker.loader.order.options import OrderOptions
order = EpochOrder(np.array([12_000_000], dtype=np.int64), "ab" * 16, 1, 0, OrderOptions())
args = (np.int64(0), np.int64(order.num_samples), np.int64(1), *order._kernel_args())
ahead = aot.function("order_range")
calling, returned = threading.Event(), threading.Event()

def call():
    calling.set()
    ahead(*args)
    returned.set()

# no forced hand-over of the GIL during the test: the only way this thread runs before the
# kernel returns is the kernel giving the GIL up
sys.setswitchinterval(30.0)
thread = threading.Thread(target=call)
thread.start()
calling.wait()
during = not returned.is_set()
thread.join()
print(json.dumps({"ran_during_the_kernel": during, "numba": "numba" in sys.modules}))
"""


def test_the_kernels_compiled_ahead_of_time_give_the_gil_up(built: str, tmp_path: Path) -> None:
    """As ``nogil=True`` JIT kernels do: another thread runs Python while one is inside an
    ahead-of-time kernel (a fresh process, so no other thread can take the GIL meanwhile)."""
    out = subprocess.run([sys.executable, "-c", _GIL], check=True, text=True,
                         capture_output=True, env={**os.environ, "STOKER_AOT": "on",
                                                   "STOKER_AOT_DIR": built})
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"ran_during_the_kernel": True, "numba": False}
