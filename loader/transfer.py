"""Moving finished batches to pinned memory and to the device.

With CUDA: the fast path already writes batches into page-locked ring buffers
(:mod:`stoker.loader.fastpath.ring`, ``pin=True``); other tensors are staged through a pinned ring
owned here. Host->device copies are issued on a side stream, an event is recorded after them,
and the consumer's current stream waits on that event, so copies overlap the compute still
queued on the GPU. The host buffers of a copy in flight are kept referenced until its event
has completed, so the ring never recycles memory a DMA is still reading.

On a CPU-only torch, ``pin_memory=True`` warns once and continues (torch's own DataLoader
does the same); pinning there would raise.
"""

from __future__ import annotations

import collections
import warnings
from typing import Any

import torch

from stoker.loader.fastpath.ring import BufferRing

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
    """Pins and/or moves each batch; a no-op when neither is asked for.

    Args:
        pin_memory: return page-locked host tensors (ignored with a warning without CUDA).
        device: move batches there; ``"cuda"`` copies on a side stream (see module doc).
        depth: copies kept in flight before the oldest is waited for (``prefetch_factor``).
    """

    _warned = False

    def __init__(self, pin_memory: bool, device: str | torch.device | None, depth: int) -> None:
        self.device = torch.device(device) if device is not None else None
        cuda = torch.cuda.is_available()
        self.cuda = self.device is not None and self.device.type == "cuda"
        if self.cuda and not cuda:
            raise ValueError(f"device={device!r} was requested but CUDA is not available; "
                             "pass device=None (or 'cpu') on this machine.")
        self.pin = (pin_memory or self.cuda) and cuda
        if pin_memory and not cuda and not Transfer._warned:
            Transfer._warned = True
            warnings.warn("pin_memory=True is ignored: no CUDA device is available, so batches "
                          "stay in ordinary memory.", RuntimeWarning, stacklevel=3)
        self.depth = max(depth, 1)
        self._stream: Any = None
        self._staging = BufferRing(self.depth + 2, pin=True) if self.pin else None
        self._in_flight: collections.deque[tuple[Any, Any]] = collections.deque()

    def _pinned(self, t: torch.Tensor, slot: Any, key: list[int]) -> torch.Tensor:
        if t.device.type != "cpu" or t.is_pinned():
            return t
        key[0] += 1
        staged = torch.from_numpy(slot.array(str(key[0]), tuple(t.shape), t.numpy().dtype)) \
            if t.dtype != torch.bfloat16 else t.pin_memory()
        staged.copy_(t)
        return staged

    def _pin(self, batch: Any) -> Any:
        if self._staging is None:
            return batch
        slot = self._staging.acquire()
        key = [0]  # each tensor of the batch gets its own named buffer in the slot
        try:
            return map_tensors(batch, lambda t: self._pinned(t, slot, key))
        finally:
            self._staging.release(slot)

    def _to_cuda(self, batch: Any) -> Any:
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        current = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(current)  # never overtake work queued before this batch
        with torch.cuda.stream(self._stream):
            moved = map_tensors(batch, lambda t: t.to(self.device, non_blocking=True))
            event = torch.cuda.Event()
            event.record(self._stream)
        current.wait_event(event)
        # the caching allocator must not reuse these blocks before the consumer's stream
        # is done with them
        map_tensors(moved, lambda t: t.record_stream(current) if t.is_cuda else None)
        self._in_flight.append((event, batch))  # host memory stays alive until copied
        self._reap()
        return moved

    def _reap(self) -> None:
        while self._in_flight and (len(self._in_flight) > self.depth
                                   or self._in_flight[0][0].query()):
            event, _ = self._in_flight.popleft()
            event.synchronize()

    def __call__(self, batch: Any) -> Any:
        if self.pin:
            batch = self._pin(batch)
        if self.cuda:
            return self._to_cuda(batch)
        if self.device is not None and self.device.type != "cpu":
            batch = map_tensors(batch, lambda t: t.to(self.device))
        return batch

    def close(self) -> None:
        """Wait for copies in flight and drop their host buffers; idempotent."""
        while self._in_flight:
            event, _ = self._in_flight.popleft()
            event.synchronize()

