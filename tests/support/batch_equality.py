"""One exact, NaN-aware comparison of two batches, shared by the equality tests.

Exact means bit for bit: every tensor has the same dtype and shape, the same NaN positions,
and every other element has the same bits (so ``-0.0`` differs from ``0.0`` and no tolerance
hides a one-ulp error); every list is equal element by element. A helper that can pass when
one value differs is worse than none, so ``tests/fastpath/test_source.py`` shows this one
failing on a single perturbed value of each kind.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["assert_batches_equal", "assert_tensors_equal"]

_BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
         torch.float64: torch.int64}


def assert_tensors_equal(a: torch.Tensor, b: torch.Tensor, name: str = "tensor") -> None:
    """``a`` and ``b`` are bitwise equal, NaNs at the same places (payloads not compared)."""
    assert a.dtype == b.dtype and a.shape == b.shape, (name, a.dtype, b.dtype, a.shape, b.shape)
    if a.dtype in _BITS:
        nan_a, nan_b = torch.isnan(a), torch.isnan(b)
        assert torch.equal(nan_a, nan_b), (name, "NaN positions differ")
        bits = _BITS[a.dtype]
        same = a.contiguous().view(bits)[~nan_a] == b.contiguous().view(bits)[~nan_b]
        assert bool(same.all()), (name, "values differ at", (~same).nonzero()[:8].tolist())
    else:
        assert torch.equal(a, b), (name, "values differ at",
                                   (a != b).nonzero()[:8].tolist())


def assert_batches_equal(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Same keys in the same order, each value exactly equal (see the module docstring)."""
    assert list(a) == list(b), (list(a), list(b))
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor), (key, type(y))
            assert_tensors_equal(x, y, key)
        else:
            assert type(x) is type(y) and x == y, (key, "values differ")
