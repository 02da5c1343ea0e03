"""Row-major copies (stoker.loader.fastpath.rowmajor): batches bitwise equal to the column path."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))  # for fastpath_helpers (importlib mode)

from fastpath_helpers import random_array, write_dataset  # noqa: E402

from stoker.loader import DataLoader, ReadOptions  # noqa: E402
from stoker.loader.fastpath import rowmajor  # noqa: E402
from stoker.loader.read.arrow import ArrowSource  # noqa: E402
from stoker.manifest import Manifest  # noqa: E402

FEATURE_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(),
                 pa.uint32(), pa.uint64(), pa.float32(), pa.float64(), pa.bool_()]
CAT_TYPES = [pa.int8(), pa.int32(), pa.int64(), pa.uint16(), pa.dictionary(pa.int32(), pa.string())]


def _list(n: int, width: int, rng: np.random.Generator, list_nulls: float,
          value_nulls: float, ragged: bool) -> pa.Array:
    """list<float32>: ``width`` values per row (``ragged``: 0..width), nulls at both levels."""
    lens = rng.integers(0, width + 1, n) if ragged else np.full(n, width)
    values = random_array(pa.float32(), int(lens.sum()), rng, value_nulls).to_pylist()
    pos = np.concatenate([[0], np.cumsum(lens)])
    mask = rng.random(n) < list_nulls
    return pa.array([None if m else values[pos[i]:pos[i + 1]] for i, m in enumerate(mask)],
                    pa.list_(pa.float32()))


def _tables(features: list[pa.DataType], cats: list[pa.DataType], sizes: list[int],
            nulls: float, seq: tuple[int, float, float, bool], seed: int) -> list[pa.Table]:
    rng = np.random.default_rng(seed)
    start = 0
    out = []
    for n in sizes:
        cols: dict[str, pa.Array] = {"id": pa.array(np.arange(start, start + n))}
        cols.update({f"f{j}": random_array(t, n, rng, nulls) for j, t in enumerate(features)})
        cols.update({f"c{j}": random_array(t, n, rng, nulls) for j, t in enumerate(cats)})
        cols["seq"] = _list(n, seq[0], rng, *seq[1:])
        out.append(pa.table(cols))
        start += n
    return out


def _bytes(batch: dict[str, Any]) -> dict[str, Any]:
    """Every output as (dtype, shape, raw bytes): bitwise comparison, NaNs included."""
    return {k: (v.dtype, tuple(v.shape), v.numpy().tobytes()) if isinstance(v, torch.Tensor)
            else v for k, v in batch.items()}


def _sources(m: Manifest, features: list[str], cats: list[str],
             **kwargs: Any) -> dict[Any, ArrowSource]:
    return {mode: ArrowSource(m, features=features, categoricals=cats, row_major=mode, **kwargs)
            for mode in (True, False, "auto")}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(features=st.lists(st.sampled_from(FEATURE_TYPES), min_size=0, max_size=5),
       cats=st.lists(st.sampled_from(CAT_TYPES), min_size=0, max_size=3),
       sizes=st.lists(st.integers(1, 40), min_size=1, max_size=3),
       batch_rows=st.integers(1, 9),
       nulls=st.sampled_from([0.0, 0.3]),
       seq=st.tuples(st.integers(0, 4), st.sampled_from([0.0, 0.2]),
                     st.sampled_from([0.0, 0.2]), st.booleans()),
       seed=st.integers(0, 2**16))
def test_row_major_batches_equal_column_path(features: list[pa.DataType],
                                             cats: list[pa.DataType], sizes: list[int],
                                             batch_rows: int, nulls: float,
                                             seq: tuple[int, float, float, bool],
                                             seed: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tables = _tables(features, cats, sizes, nulls, seq, seed)
        m = write_dataset(Path(tmp), tables, batch_rows=batch_rows)
        fnames = [f"f{j}" for j in range(len(features))]
        cnames = [f"c{j}" for j in range(len(cats))]
        sources = _sources(m, fnames, cnames)
        rng = np.random.default_rng(seed)
        total = sum(sizes)
        for size in (1, 7, total):  # `total`: every shard and record batch in one batch
            ids = rng.permutation(total)[:size]
            first = {mode: _bytes(s.fetch(ids)) for mode, s in sources.items()}
            sources["auto"].wait_row_major()
            again = _bytes(sources["auto"].fetch(ids))  # served by the copies now
            assert first[True] == first[False] == first["auto"] == again
        # which outputs the records serve: every fixed-width one; seq when every shard with
        # records has lists of one (non-zero) length and no null list
        for mode in (True, "auto"):
            src = sources[mode]
            table = src._records
            if table is None:  # no shard is zero-copy (e.g. empty list values): pyarrow path
                assert all(data is None for data in src._data.values())
                continue
            served = {f.name for f in table.fields}
            assert {"id"} | ({"features"} if fnames else set()) \
                | ({"categoricals"} if cnames else set()) <= served
            widths = set()
            for s, data in src._data.items():
                if data is None:  # not zero-copy (e.g. empty list values): pyarrow path
                    assert s not in table
                    continue
                assert s in table and table._records[s].shape == (data.starts[-1], table.layout.stride)
                seqs = tables[s].column("seq")
                lengths = set(pa.compute.list_value_length(seqs).to_pylist())
                widths.add(lengths.pop() if seqs.null_count == 0 and len(lengths) == 1 else 0)
            assert ("seq" in served) == (len(widths) == 1 and 0 not in widths)
        assert sources[False]._records is None
        assert sources[False].row_major_bytes == 0
        for s in sources.values():
            s.close()
            assert s.row_major_bytes == 0


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Manifest:
    tables = _tables([pa.float32(), pa.int16(), pa.float64()], [pa.int64(), pa.int8()],
                     [50, 30, 20], 0.1, (3, 0.0, 0.1, False), 7)
    return write_dataset(tmp_path_factory.mktemp("rowmajor"), tables, batch_rows=8)


FEATS, CATS = ["f0", "f1", "f2"], ["c0", "c1"]
# rows x record stride: features 3 float32 (12 -> 16 bytes, fields are 8-aligned), categoricals
# 2 int64 (16), id int64 (8), seq 3 float32 (12 -> 16)
SHARD_BYTES = [n * (16 + 16 + 8 + 16) for n in (50, 30, 20)]


def test_budget_accounts_for_open_shards_and_eviction(dataset: Manifest) -> None:
    src = ArrowSource(dataset, features=FEATS, categoricals=CATS, row_major=True, max_open=1)
    for s in range(3):
        src._table(s)
        assert src.row_major_bytes == SHARD_BYTES[s]  # the evicted shard's copy is released
        assert s in src._records and all(t not in src._records for t in range(s))
    assert [f.name for f in src._records.fields] == ["features", "categoricals", "id", "seq"]
    src.close()
    assert src.row_major_bytes == 0


def test_auto_skips_shards_beyond_the_budget(dataset: Manifest,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    budget = SHARD_BYTES[0] + SHARD_BYTES[1]
    monkeypatch.setattr(rowmajor, "AUTO_BUDGET_BYTES", budget)
    src = ArrowSource(dataset, features=FEATS, categoricals=CATS, row_major="auto")
    ref = ArrowSource(dataset, features=FEATS, categoricals=CATS, row_major=False)
    ids = np.random.default_rng(1).permutation(100)
    src.fetch(ids)  # opens the three shards at once: which reserve first is timing
    src.wait_row_major()
    held = [s for s in range(3) if s in src._records]
    assert src.row_major_bytes == sum(SHARD_BYTES[s] for s in held) <= budget
    assert held and all(src.row_major_bytes + SHARD_BYTES[s] > budget
                        for s in range(3) if s not in held)  # each left out did not fit
    assert _bytes(src.fetch(ids)) == _bytes(ref.fetch(ids))  # mixed copies and columns


def test_row_major_option_is_checked(dataset: Manifest) -> None:
    with pytest.raises(ValueError, match="row_major='yes' is not supported"):
        ArrowSource(dataset, features=FEATS, row_major="yes")


def test_dataloader_passes_row_major(dataset: Manifest) -> None:
    def epoch(mode: Any) -> list[dict[str, Any]]:
        loader = DataLoader(dataset, batch_size=16, shuffle=True, seed=3,
                            read=ReadOptions(features=FEATS, categoricals=CATS, row_major=mode))
        # a small dataset's records fit the budget: shuffled reads use them, not staging,
        # unless staging is asked for
        assert (loader._source.stager is not None) == (mode == "staged")
        if mode != "staged":
            assert loader._source._records_mode == rowmajor.resolve_mode(mode)
        return [_bytes(b) for b in loader]

    assert epoch(True) == epoch(False) == epoch("auto") == epoch("staged")


def test_a_staged_source_reads_ids_outside_its_order_from_the_columns(
        dataset: Manifest) -> None:
    """Ids a caller chose (reversed, or spread over every round of the epoch) read through a
    staged source: the same bytes as the columns give; a batch spanning more rounds than are
    staged is the named fallback (it raised, or waited for a buffer forever, before)."""
    from stoker.loader import ShuffleOptions, fallbacks

    loader = DataLoader(dataset, batch_size=16, seed=3,
                        shuffle=ShuffleOptions(partitions=2, block_size=8),
                        read=ReadOptions(features=FEATS, categoricals=CATS, row_major="staged"))
    staged = loader._source
    assert staged.stager is not None and staged.stager.order(0, 3).blocks_per_partition() > 4
    ref = ArrowSource(dataset, features=FEATS, categoricals=CATS, row_major=False)
    order = staged.stager.order(0, 3)
    in_order = order.ids(0, 32)  # rounds 0 and 1 (partitions of 8-row blocks)
    assert order.block_of(in_order[[0, -1]]).tolist() == [0, 1]
    spread = order.ids(0, order.num_samples)[::7]
    with fallbacks.collecting() as noted:
        got = [_bytes(staged.fetch(ids, 0, 3)) for ids in (in_order, in_order[::-1], spread)]
    want = [_bytes(ref.fetch(ids, 0, 3)) for ids in (in_order, in_order[::-1], spread)]
    assert got == want
    assert list(noted) == ["ids_not_staged"]
    flipped = dict(want[2])
    dtype, shape, raw = flipped["id"]
    flipped["id"] = (dtype, shape, bytes([raw[0] ^ 1]) + raw[1:])
    assert got[2] != flipped  # the comparison can fail
    loader.close()
    ref.close()


def test_auto_builds_no_copies_in_forked_workers(dataset: Manifest) -> None:
    for mode, expected in (("auto", 0), (True, sum(SHARD_BYTES))):
        src = ArrowSource(dataset, features=FEATS, categoricals=CATS, row_major=mode)
        src._rm.owner_pid = -1  # as in a worker process forked after construction
        src.fetch(np.arange(100))
        src.wait_row_major()
        assert src.row_major_bytes == expected


WARM_SCRIPT = """
import sys
import numpy as np
from stoker.loader.fastpath import kernels
from stoker.loader.fastpath import record_table
from stoker.loader.fastpath import rowmajor
from stoker.loader.jit import warmup
from stoker.loader.read.arrow import ArrowSource
from stoker.manifest import Manifest

kernels_ = [kernels.gather_fixed, kernels.gather_list, kernels.var_lengths,
            kernels.gather_binary, kernels.copy_ranges, record_table._gather]
src = ArrowSource(Manifest.load(sys.argv[1]), features=["f0", "f1", "f2"],
                  categoricals=["c0", "c1"], row_major=True)
warmup.wait()
warm = [set(k.signatures) for k in kernels_]
src.fetch(np.arange(100))
assert warm[0] and warm[4] and warm[5], warm
assert [set(k.signatures) for k in kernels_] == warm, "a batch needed a kernel not warmed"
print("ok")
"""


def test_warmup_loads_every_kernel_a_batch_needs(dataset: Manifest, tmp_path: Path) -> None:
    import subprocess

    script = tmp_path / "warm.py"
    script.write_text(WARM_SCRIPT)
    out = subprocess.run([sys.executable, str(script), str(dataset.root)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_numpy_gather_equals_the_kernel(dataset: Manifest) -> None:
    """The NumPy gather (first batches of a fresh process) writes what the kernel writes."""
    src = ArrowSource(dataset, features=FEATS, categoricals=CATS, row_major=True)
    src._table(0)
    src._table(2)  # shard 1 has no records: its rows must come back as missing
    table = src._records
    ids = np.random.default_rng(3).permutation(100)
    kernel, missing, touched = table.gather(ids, src._starts, src.ring.acquire())
    slot = src.ring.acquire()
    arrays = {f.name: slot.array(f.name, (len(ids), f.width), f.dtype) for f in table.fields}
    for a in arrays.values():
        a.fill(0)
    np_missing, np_touched = table._gather_numpy(
        ids, src._starts, table.fields, [arrays[f.name].view(np.uint8) for f in table.fields])
    assert np_missing.tolist() == missing.tolist() == np.flatnonzero((ids >= 50) & (ids < 80)).tolist()
    assert sorted(np_touched.tolist()) == sorted(touched.tolist()) == [0, 2]
    held = np.setdiff1d(np.arange(len(ids)), missing)
    for name, arr in arrays.items():
        assert arr[held].tobytes() == kernel[name][held].tobytes(), name


def test_numpy_twins_serve_only_the_first_call_while_warming(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from stoker.loader.jit import warmup

    monkeypatch.setattr(warmup, "_first", set())
    monkeypatch.setattr(warmup, "_threads", [])
    assert not warmup.first_call("load")  # nothing warming: call the kernel (it loads)
    release = threading.Event()
    busy = threading.Thread(target=release.wait)
    busy.start()
    try:
        monkeypatch.setattr(warmup, "_threads", [busy])
        assert warmup.first_call("gather") and warmup.first_call("order")
        assert not warmup.first_call("gather") and not warmup.first_call("order")
    finally:
        release.set()
        busy.join()


@pytest.mark.parametrize("mode", [False, True])
def test_a_closed_shard_is_freed_without_the_garbage_collector(dataset: Manifest,
                                                               mode: bool) -> None:
    """No reference cycle may keep a closed shard's memory map alive: in a cache on a small
    disk, the evicted file's space is only freed when the map goes (found by fault case 11)."""
    import gc
    import weakref

    gc.collect()
    gc.disable()
    try:
        src = ArrowSource(dataset, features=FEATS, categoricals=CATS, row_major=mode)
        src.fetch(np.arange(100))
        src.wait_row_major()
        refs = [weakref.ref(d) for d in src._data.values() if d is not None]
        assert refs
        src.close()
        del src
        assert [r() for r in refs] == [None] * len(refs)
    finally:
        gc.enable()


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=6), min_size=1,
                        max_size=5),
       same=st.booleans(), kind=st.sampled_from(["list", "large_list", "fixed"]),
       skip=st.integers(0, 2), null=st.booleans())
def test_list_width_is_what_pyarrow_compute_says(lengths: list[list[int]], same: bool,
                                                 kind: str, skip: int, null: bool) -> None:
    """A list column's common width over a shard's batches, read from their offsets (no
    ``pyarrow.compute``), against pyarrow's own lengths: batches of any sizes (empty too),
    sliced arrays (offsets not from 0), one length in a batch that differs, a null list."""
    width = 2
    batches = []
    for lens in lengths:
        lens = [width] * len(lens) if same or kind == "fixed" else lens
        rows = [[1.0] * n for n in [width] * skip + lens]
        if null and rows:
            rows[-1] = None
        typ = {"list": pa.list_(pa.float32()), "large_list": pa.large_list(pa.float32()),
               "fixed": pa.list_(pa.float32(), width)}[kind]
        batches.append(pa.record_batch({"s": pa.array(rows, typ).slice(skip)}))
    column = pa.chunked_array([b.column("s") for b in batches])
    bounds = pa.compute.min_max(pa.compute.list_value_length(column)).as_py()
    want = 0 if column.null_count or bounds["min"] is None or bounds["min"] != bounds["max"] \
        else bounds["min"]
    assert rowmajor._list_width(batches, "s") == want
