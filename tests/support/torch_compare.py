"""Exact comparison of what two DataLoaders yield (tensors, dicts, lists, named tuples)."""

from __future__ import annotations

from typing import Any

import torch


def assert_same(a: Any, b: Any) -> None:
    """``a`` and ``b`` are the same batch: same structure and types, tensors of the same
    dtype and shape with exactly equal values (NaN equal to NaN)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert type(a) is type(b) and a == b
