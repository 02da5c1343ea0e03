"""Builders of small on-disk stoker datasets for fast-path tests."""

from __future__ import annotations

import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from shard_writer import write_dataset  # noqa: E402,F401 - re-exported for the fast-path tests

__all__ = ["count_tile_builds", "mixed_table", "open_shard", "random_array", "record_table",
           "write_dataset"]


def mixed_table(n: int, start: int, seed: int) -> pa.Table:
    """Every column kind the fast path handles, with nulls, plus one it does not (struct)."""
    rng = np.random.default_rng(seed)
    mask = rng.random(n) < 0.2
    ids = np.arange(start, start + n, dtype=np.int64)
    lens = rng.integers(0, 5, n)
    return pa.table({
        "id": ids,
        "f0": pa.array(rng.standard_normal(n).astype(np.float32), mask=mask),
        "f1": pa.array(rng.integers(-50, 50, n).astype(np.int32)),
        "f2": pa.array(rng.standard_normal(n), mask=~mask),
        "c0": pa.array(rng.integers(0, 9, n), mask=mask),
        "c1": pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, 3, n).astype(np.int8)),
                                             pa.array(["x", "y", "z"])),
        "flag": pa.array(rng.random(n) < 0.5, mask=mask),
        "seq": pa.array([None if m else [float(i)] * int(k) for i, k, m in zip(ids, lens, mask)],
                        pa.list_(pa.float32())),
        "blob": pa.array([None if m else bytes([i % 256]) * int(k)
                          for i, k, m in zip(ids, lens, mask)], pa.binary()),
        "name": [f"s{i}" for i in ids],
        "pt": pa.array([{"a": int(i)} for i in ids], pa.struct([("a", pa.int64())])),
    })


def random_array(t: pa.DataType, n: int, rng: np.random.Generator, nulls: float) -> pa.Array:
    """``n`` random values of ``t`` (nulls at rate ``nulls``; NaNs in floats, ragged lists,
    random bytes for binary and hex for strings)."""
    mask = rng.random(n) < nulls
    if pa.types.is_dictionary(t):
        codes = pa.array(rng.integers(0, 3, n).astype(np.int32), mask=mask)
        return pa.DictionaryArray.from_arrays(codes, pa.array(["a", "b", "c"]))
    if pa.types.is_boolean(t):
        return pa.array(rng.random(n) < 0.5, mask=mask)
    if pa.types.is_date32(t) or pa.types.is_timestamp(t):
        storage = pa.int32() if pa.types.is_date32(t) else pa.int64()
        return pa.array(rng.integers(-1000, 10**6, n), storage, mask=mask).view(t)
    if pa.types.is_floating(t):
        v = rng.standard_normal(n) * 1e6
        v[rng.random(n) < 0.05] = np.nan
        return pa.array(v.astype(t.to_pandas_dtype()), mask=mask)
    if pa.types.is_integer(t):
        info = np.iinfo(t.to_pandas_dtype())
        return pa.array(rng.integers(info.min, info.max, n, dtype=t.to_pandas_dtype(),
                                     endpoint=True), mask=mask)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        lens = rng.integers(0, 5, n)
        child = random_array(t.value_type, int(lens.sum()), rng, nulls)
        items = child.to_pylist()
        pos = np.concatenate([[0], np.cumsum(lens)])
        return pa.array([None if m else items[pos[i]:pos[i + 1]] for i, m in enumerate(mask)], t)
    lens = rng.integers(0, 6, n)
    raw = [bytes(rng.integers(0, 256, k, dtype=np.uint8)) for k in lens]
    vals: list[Any] = [r.hex() for r in raw] if pa.types.is_string(t) else raw
    return pa.array([None if m else v for v, m in zip(vals, mask)], t)


def record_table(n: int, start: int, seed: int) -> pa.Table:
    """Rows whose fixed-width outputs fit row-major records: float features (with nulls), an
    int16 feature, an int32 categorical and a list<float32> of length 3; ``id`` = global id."""
    rng = np.random.default_rng(seed)
    return pa.table({
        "id": pa.array(np.arange(start, start + n)),
        "f0": pa.array(rng.standard_normal(n).astype(np.float32), mask=rng.random(n) < 0.1),
        "f1": pa.array(rng.integers(-50, 50, n).astype(np.int16)),
        "c0": pa.array(rng.integers(0, 9, n).astype(np.int32)),
        "seq": pa.array([rng.standard_normal(3).astype(np.float32).tolist() for _ in range(n)],
                        pa.list_(pa.float32())),
    })


def open_shard(m: Any, index: int, features: list[str], categoricals: list[str],
               columns: list[str]) -> tuple[Any, Any, Any]:
    """Shard ``index`` of manifest ``m`` opened as the loader opens it: (its fast plan, its
    ShardData, its record layout)."""
    from stoker.loader.fastpath import rowmajor
    from stoker.loader.fastpath.plan import FastPlan, ShardData

    plan = FastPlan(m.arrow_schema, [*features, *categoricals, *columns], features,
                    categoricals)
    source = pa.memory_map(str(Path(m.root) / m.shards[index].path), "r")
    arena = source.read_buffer(source.size())
    batches = pa.ipc.open_file(arena).read_all().to_batches()
    layout = rowmajor.RecordLayout.of(plan, batches)
    assert layout is not None
    return plan, ShardData(batches, arena, plan.kernel_columns), layout


def count_tile_builds(monkeypatch: Any, tile_rows: int) -> Counter[int]:
    """Records tiles of ``tile_rows`` rows (stoker.loader.fastpath.rowmajor.Tiles) from now
    on; the builds of each tile by this process (a forked child inherits the patch), counted
    by the tile's first row. Not those of loaders' builder threads (``stoker-rowmajor``): a
    loader an earlier test left building must not count here."""
    from stoker.loader.fastpath import rowmajor

    monkeypatch.setattr(rowmajor.Tiles, "TILE_ROWS", tile_rows)
    built: Counter[int] = Counter()
    real = rowmajor.copy_runs

    def counted(rec: np.ndarray, fields: Any, data: Any, first: np.ndarray, *rest: Any) -> None:
        if not threading.current_thread().name.startswith("stoker-rowmajor"):
            built[int(first[0])] += 1
        real(rec, fields, data, first, *rest)

    monkeypatch.setattr(rowmajor, "copy_runs", counted)
    return built
