"""Arrow columns -> batch tensors, vectorised (no per-row Python for numeric data).

Conversion rules (documented for users):
- fixed-width numeric and bool columns -> 1-D tensors of the column's dtype;
  nulls become 0 (``False`` for bool);
- dictionary (categorical) columns -> their int64 codes;
- timestamps, dates and durations -> int64 in the column's unit;
- list / fixed-size-list of numbers -> ``[B, L]`` tensors; when lengths differ, padded with 0
  to the longest row and the lengths returned as ``<name>_lengths`` (int64);
- strings and binary -> Python lists (``str`` / ``bytes``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import torch

__all__ = ["stack_features", "table_to_batch"]


def _compute() -> Any:
    """``pyarrow.compute``, imported at its first use: importing it takes ~0.1 s (it writes
    the docstrings of every compute function), which a process whose columns have no nulls
    and no lists of differing lengths never needs."""
    import pyarrow.compute as pc

    return pc


def _numeric(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    t = arr.type
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_dictionary(t):
        return _numeric(arr.indices).astype(np.int64, copy=False)
    if pa.types.is_temporal(t):  # raw value in the column's unit (date32 is days, 32-bit)
        arr = arr.view(pa.int32() if t.bit_width == 32 else pa.int64()).cast(pa.int64())
    if arr.null_count:
        arr = _compute().fill_null(arr, False if pa.types.is_boolean(t) else 0)
    # writable=True: torch refuses to wrap read-only (Arrow-owned) memory without a warning
    return np.ascontiguousarray(arr.to_numpy(zero_copy_only=False, writable=True))


def _is_numeric(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
            or pa.types.is_dictionary(t) or pa.types.is_temporal(t))


def _list_column(name: str, arr: pa.ChunkedArray, out: dict[str, Any]) -> None:
    arr = arr.combine_chunks()
    if arr.null_count:
        arr = _compute().fill_null(arr, pa.scalar([], type=arr.type))
    if pa.types.is_fixed_size_list(arr.type):
        width = arr.type.list_size
        values = _numeric(arr.flatten())
        out[name] = torch.from_numpy(values.reshape(len(arr), width))
        return
    lengths = _compute().list_value_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)
    values = _numeric(arr.flatten())
    width = int(lengths.max()) if len(lengths) else 0
    if len(lengths) and (lengths == width).all():
        out[name] = torch.from_numpy(values.reshape(len(arr), width))
        return
    padded = np.zeros((len(arr), width), dtype=values.dtype)
    mask = np.arange(width)[None, :] < lengths[:, None]
    padded[mask] = values
    out[name] = torch.from_numpy(padded)
    out[f"{name}_lengths"] = torch.from_numpy(lengths)


def table_to_batch(table: pa.Table) -> dict[str, Any]:
    """Convert a (taken, in-order) Arrow table into the batch dict described above."""
    out: dict[str, Any] = {}
    for name, col in zip(table.column_names, table.columns):
        t = col.type
        if _is_numeric(t):
            out[name] = torch.from_numpy(_numeric(col))
        elif (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) \
                and _is_numeric(t.value_type):
            _list_column(name, col, out)
        else:
            out[name] = col.to_pylist()
    return out


def stack_features(table: pa.Table, features: Sequence[str]) -> torch.Tensor:
    """Stack numeric columns into one float32 ``[B, K]`` tensor (nulls -> 0)."""
    out = np.empty((table.num_rows, len(features)), dtype=np.float32)
    for j, name in enumerate(features):
        out[:, j] = _numeric(table.column(name))
    return torch.from_numpy(out)
