"""Moving finished batches to pinned memory and to the device.

On a CPU-only torch, ``pin_memory=True`` warns once and continues (torch's own DataLoader
does the same); pinning there would raise.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

__all__ = ["Transfer", "map_tensors"]


def map_tensors(batch: Any, fn: Any) -> Any:
    """Apply ``fn`` to every tensor inside dicts, lists and tuples of ``batch``."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return {k: map_tensors(v, fn) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(map_tensors(v, fn) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(map_tensors(v, fn) for v in batch)
    return batch


class Transfer:
    """Pins and/or moves each batch; a no-op when neither is asked for."""

    _warned = False

    def __init__(self, pin_memory: bool, device: str | torch.device | None, depth: int) -> None:
        self.device = torch.device(device) if device is not None else None
        cuda = torch.cuda.is_available()
        wants_cuda = self.device is not None and self.device.type == "cuda"
        if wants_cuda and not cuda:
            raise ValueError(f"device={device!r} was requested but CUDA is not available; "
                             "pass device=None (or 'cpu') on this machine.")
        self.pin = pin_memory and cuda
        if pin_memory and not cuda and not Transfer._warned:
            Transfer._warned = True
            warnings.warn("pin_memory=True is ignored: no CUDA device is available, so batches "
                          "stay in ordinary memory.", RuntimeWarning, stacklevel=3)
        self.depth = depth

    def __call__(self, batch: Any) -> Any:
        if self.pin:
            batch = map_tensors(batch, lambda t: t.pin_memory())
        if self.device is not None and self.device.type != "cpu":
            batch = map_tensors(batch, lambda t: t.to(self.device, non_blocking=self.pin))
        return batch

    def close(self) -> None:
        """Nothing held yet; the pinned ring buffer will release its memory here."""
