"""How a worker process hands a batch to the consumer: tensor bytes through the pipe.

torch's own reduction shares each CPU tensor's storage as a file descriptor, passed through
a new Unix socket connection per tensor (multiprocessing's resource sharer); measured here, a
W1 batch (four tensors, 400 KB) crossed that way at ~400 batches/s, which capped process
workers at 0.4 M W1 rows/s whatever the number of workers (bench/workers_bench.py). Pickling
the same bytes into the pipe crossed at ~1,300 batches/s. So a contiguous CPU tensor of a
NumPy-representable dtype and at most :data:`BY_BYTES_MAX` bytes travels as its bytes (one
copy into the pipe, one out; the consumer gets a new, writable tensor with the same dtype,
shape and values). Anything else keeps torch's reduction: other dtypes, strided views, tensors
that require grad, subclasses, and large tensors, whose two copies cost more than the fixed
cost of sharing (a W2 batch's 3 MB of pixels: 2 process workers 29 k images/s shared, 25 k
as bytes).
Unlike torch's DataLoader, such tensors are then not in shared memory (``is_shared()`` is
False): nothing in a batch's values depends on it.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch
from multiprocessing.reduction import ForkingPickler

__all__ = ["BY_BYTES_MAX", "dumps"]

BY_BYTES_MAX = 1 << 20  # bytes; above it, sharing the storage beats copying it twice

_BY_BYTES = {torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
             torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128}


def _tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array)


class _BatchPickler(ForkingPickler):
    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is torch.Tensor and obj.device.type == "cpu" and obj.dtype in _BY_BYTES \
                and not obj.requires_grad and obj.layout is torch.strided \
                and obj.is_contiguous() and obj.numel() * obj.element_size() <= BY_BYTES_MAX:
            return _tensor, (obj.numpy(),)
        return NotImplemented


def dumps(obj: Any) -> bytes:
    """``obj`` pickled for the consumer (``ForkingPickler.loads`` reads it)."""
    buf = io.BytesIO()
    _BatchPickler(buf).dump(obj)
    return buf.getvalue()
