"""How a worker process hands a batch to the consumer: tensor bytes through shared memory.

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

The pipe itself was the next limit: Python reads a pipe in 64 KiB pieces into a BytesIO and
copies the result again, ~1 ms per 400 KB batch on this machine, and the consumer spent most
of its time there (profiled: 2.6 of 3.2 s in ``Connection._recv``). So a forked worker writes
its batch into a :class:`Ring` of shared-memory slots made before the fork (pickle protocol 5:
the tensors' bytes go out of band, each copied once into the slot) and sends only a slot
reference; the consumer copies each buffer once out of the slot into a fresh array the new
tensor owns. A slot is written again only after the consumer read it (the worker holds at
most the pool's limit of batches, :data:`IN_FLIGHT` tasks, and the ring has one slot more);
a stamp written before the payload and checked after the copy would catch a slot overwritten
early. The consumer hands tasks over the same way, through a second ring per worker: a group
of 8 batches' ids (64 KB) filled the pipe, and the consumer's send waited for the worker.
"""

from __future__ import annotations

import io
import mmap
import pickle
import struct
from typing import Any

import numpy as np
import torch
from multiprocessing.reduction import ForkingPickler

from stoker.loader.errors import LoaderError

__all__ = ["BY_BYTES_MAX", "IN_FLIGHT", "Ring", "RingError", "dumps"]

BY_BYTES_MAX = 1 << 20  # bytes; above it, sharing the storage beats copying it twice
IN_FLIGHT = 2  # tasks handed to one worker process at a time (the pool's limit)
SLOT_BYTES = 8 << 20  # one slot of a ring: a W2 batch (256 x 64 x 64 x 3 pixels) fits
_ALIGN = 64
_REF = b"R"  # a slot reference (a pickle starts with its PROTO opcode, 0x80)
_HEAD = struct.Struct("<QQ")  # slot header: stamp, number of buffers


class RingError(LoaderError):
    """A ring slot was overwritten before the consumer read it: a bug in the hand-over
    (not a ``RuntimeError``: the pool reads those as a dead worker and would restart it)."""

_BY_BYTES = {torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
             torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128}


def _tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array)


class _BatchPickler(ForkingPickler):
    limit = BY_BYTES_MAX

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is torch.Tensor and obj.device.type == "cpu" and obj.dtype in _BY_BYTES \
                and not obj.requires_grad and obj.layout is torch.strided \
                and obj.is_contiguous() and obj.numel() * obj.element_size() <= self.limit:
            return _tensor, (obj.numpy(),)
        return NotImplemented


class _RingPickler(_BatchPickler):
    """Tensors up to a slot's size go as bytes: one copy in, one out, cheaper than sharing."""

    def __init__(self, file: Any, buffer_callback: Any, limit: int) -> None:
        # ForkingPickler.__init__ takes no keywords before Python 3.12: its body, with them
        pickle.Pickler.__init__(self, file, 5, buffer_callback=buffer_callback)
        self.limit = limit
        self.dispatch_table = self._copyreg_dispatch_table.copy()
        self.dispatch_table.update(self._extra_reducers)


def dumps(obj: Any) -> bytes:
    """``obj`` pickled for the consumer (``ForkingPickler.loads`` reads it)."""
    buf = io.BytesIO()
    _BatchPickler(buf).dump(obj)
    return buf.getvalue()


class Ring:
    """Shared-memory slots through which one forked worker process hands batches over.

    Made by the consumer before the fork (an anonymous shared mapping, inherited by the
    child); the worker calls :meth:`put`, the consumer :meth:`loads` on what arrived through
    the pipe. Not for ``spawn``/``forkserver`` workers (they do not inherit the mapping).
    """

    def __init__(self, slots: int = IN_FLIGHT + 1, slot_bytes: int = SLOT_BYTES) -> None:
        self.slots, self.slot_bytes = slots, slot_bytes
        self._map = mmap.mmap(-1, slots * slot_bytes)  # MAP_SHARED | MAP_ANONYMOUS
        self._view = np.frombuffer(self._map, dtype=np.uint8)
        self._stamp = 0  # the worker's count of batches put

    def put(self, obj: Any) -> bytes:
        """What the worker sends through the pipe for ``obj``: a slot reference after writing
        ``obj`` into the next slot, or the whole pickle when it does not fit a slot."""
        buffers: list[pickle.PickleBuffer] = []
        buf = io.BytesIO()
        _RingPickler(buf, buffers.append, self.slot_bytes).dump(obj)
        parts = [buf.getbuffer(), *(b.raw() for b in buffers)]
        sizes = [p.nbytes for p in parts]
        offsets = np.cumsum([_HEAD.size] + [-(-n // _ALIGN) * _ALIGN for n in sizes])
        if offsets[-1] > self.slot_bytes:
            return dumps(obj)
        self._stamp += 1
        slot = self._stamp % self.slots
        base = slot * self.slot_bytes
        view = self._view
        view[base:base + _HEAD.size] = np.frombuffer(_HEAD.pack(self._stamp, len(parts)),
                                                     dtype=np.uint8)
        for part, at, n in zip(parts, offsets[:-1].tolist(), sizes):
            view[base + at:base + at + n] = np.frombuffer(part, dtype=np.uint8)
        return _REF + struct.pack(f"<QQ{len(sizes)}Q", self._stamp, len(sizes), *sizes)

    def loads(self, raw: bytes) -> Any:
        """The object behind ``raw`` (a slot reference or a whole pickle); each buffer is
        copied out of the slot, so the slot can be written again at once."""
        if raw[:1] != _REF:
            return ForkingPickler.loads(raw)
        stamp, count = struct.unpack_from("<QQ", raw, 1)
        sizes = struct.unpack_from(f"<{count}Q", raw, 17)
        base = (stamp % self.slots) * self.slot_bytes
        view = self._view
        at = _HEAD.size
        parts = []
        for n in sizes:
            parts.append(view[base + at:base + at + n].copy())
            at += -(-n // _ALIGN) * _ALIGN
        if _HEAD.unpack_from(self._map, base) != (stamp, count):
            raise RingError(f"ring slot {stamp % self.slots} holds another batch than the one "
                            f"announced ({stamp}): it was overwritten before it was read")
        return ForkingPickler.loads(parts[0].tobytes(), buffers=parts[1:])

    def close(self) -> None:
        """Unmap the slots (the consumer, when the worker is gone), or, while something still
        views them (a frame kept by an exception's traceback), when that view is collected."""
        self._view = None
        try:
            self._map.close()
        except BufferError:  # exported: the mapping goes with its last view, nothing is lost
            return
