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
reference. Each slot has a state byte in the same mapping (free, written, lent): a worker
writes only a free slot, and the consumer frees it once read.

The consumer *lends* a results slot instead of copying out of it, as torch's DataLoader hands
out tensors in shared memory: the batch's tensors view the slot, and the slot is free again
when the last of them is collected (a training loop drops each batch by the next step). A
copy out of the slot cost ~65 us of the consumer's CPU per W1 batch, most of it page faults
of the fresh arrays. A ring lends at most ``leases`` slots at once; a caller that keeps more
batches (``list(loader)``) gets copies from then on (the ``batch_copied`` fallback), so a
worker always finds a free slot and no batch a caller holds is ever written again.
A stoker batch (a worker's answer whose batch is a dict of plain tensors) is not pickled at
all: its arrays are copied into the slot and the pipe message carries their names, dtypes and
shapes (:meth:`Ring.put`). A group task's batches (up to 8) are gathered by the source
straight into a slot the worker borrowed (:class:`Region`) and announced in one message
(:meth:`Ring.put_group`): copying each batch into its own slot and sending it alone cost the
workers ~18 % of their CPU and the consumer a poll, a read and a rebuild per batch (5 M W1
rows, 2 process workers: bench/RESULTS.md "Workers (5,000,000 W1 rows)"). The consumer hands
tasks over the same way as other objects,
through a second ring per worker (copied out, not lent): a group of 8 batches' ids (64 KB)
filled the pipe, and the consumer's send waited for the worker.
"""

from __future__ import annotations

import ctypes
import functools
import io
import math
import mmap
import os
import pickle
import struct
from typing import Any, Sequence

import numpy as np
import torch
from multiprocessing.reduction import ForkingPickler

from stoker.loader.errors import LoaderError
from stoker.loader.fallbacks import note

__all__ = ["BY_BYTES_MAX", "IN_FLIGHT", "LEASES", "Answers", "Ring", "RingError", "dumps"]

BY_BYTES_MAX = 1 << 20  # bytes; above it, sharing the storage beats copying it twice
IN_FLIGHT = 2  # tasks handed to one worker process at a time (the pool's limit)
SLOT_BYTES = 8 << 20  # one slot of a ring: a W2 batch (256 x 64 x 64 x 3 pixels) fits
LEASES = 8  # results slots a ring lends at once (batches a caller holds without a copy)
_ALIGN = 64
_REF = b"R"  # a slot reference (a pickle starts with its PROTO opcode, 0x80)
_PLAIN = b"P"  # a slot reference to a plain answer's arrays (see _plain)
_PLAIN_HEAD = struct.Struct("<QQ")  # after _PLAIN/_GROUP: stamp, slot; then the pickled heads
_GROUP = b"G"  # a slot reference to several plain answers' arrays (see Ring.put_group)
_HEAD = struct.Struct("<QQ")  # slot header: stamp, number of buffers
_FREE, _WRITTEN, _LENT = 0, 1, 2  # a slot's state byte


class Answers(list):  # type: ignore[type-arg]
    """What :meth:`Ring.loads` gives for a group message: its ``(key, answer)`` pairs."""


class RingError(LoaderError):
    """A ring slot was overwritten before the consumer read it: a bug in the hand-over
    (not a ``RuntimeError``: the pool reads those as a dead worker and would restart it)."""

_BY_BYTES = {torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
             torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128}


def _tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array)


def _by_bytes(obj: Any, limit: int) -> bool:
    """Whether ``obj`` is a tensor that travels as its bytes (see the module docstring).
    ``is_cpu`` and ``nbytes``, not ``device.type`` and ``numel() * element_size()``: this
    runs for every tensor of every batch a worker process hands over (~0.45 us less each)."""
    return type(obj) is torch.Tensor and obj.is_cpu and obj.dtype in _BY_BYTES \
        and not obj.requires_grad and obj.layout is torch.strided \
        and obj.is_contiguous() and obj.nbytes <= limit


@functools.cache
def _numpy_str(dtype: torch.dtype) -> str:
    """NumPy's ``dtype.str`` of the arrays ``Tensor.numpy()`` gives for ``dtype``."""
    return torch.empty(0, dtype=dtype).numpy().dtype.str


def _plain(obj: Any, limit: int) -> list[tuple[str, torch.Tensor]] | None:
    """The tensors of a *plain answer*: ``(key, answer)`` where ``answer`` is a named tuple
    whose first field is a dict of string keys to tensors that travel as bytes (a stoker
    batch: stoker.loader.epoch_iter.Delivered); ``None`` for anything else."""
    if type(obj) is not tuple or len(obj) != 2:
        return None
    answer = obj[1]
    if not isinstance(answer, tuple) or not hasattr(answer, "_make") or not answer \
            or type(answer[0]) is not dict:
        return None
    tensors = []
    for name, value in answer[0].items():
        if type(name) is not str or not _by_bytes(value, limit):
            return None
        tensors.append((name, value))
    return tensors


class _BatchPickler(ForkingPickler):
    limit = BY_BYTES_MAX

    def reducer_override(self, obj: Any) -> Any:
        if _by_bytes(obj, self.limit):
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

    Args:
        slots: slots a writer may hold unread at once, plus one.
        slot_bytes: bytes of one slot (a larger object goes through the pipe).
        leases: further slots the reader may lend (see the module docstring); 0 copies out.
    """

    def __init__(self, slots: int = IN_FLIGHT + 1, slot_bytes: int = SLOT_BYTES,
                 leases: int = 0) -> None:
        self.slots, self.slot_bytes, self.leases = slots + leases, slot_bytes, leases
        data = self.slots * slot_bytes
        self._map = mmap.mmap(-1, data + self.slots)  # MAP_SHARED | MAP_ANONYMOUS
        self._view = np.frombuffer(self._map, dtype=np.uint8)
        self._state = self._view[data:]
        self._stamp = 0  # the worker's count of batches put
        self._lent = _lent_type(slot_bytes)

    def plain(self, obj: Any) -> list[tuple[str, torch.Tensor]] | None:
        """The tensors of ``obj`` if it is a plain answer that fits a slot (:func:`_plain`),
        else ``None``: what :meth:`put_group` takes with it."""
        return _plain(obj, self.slot_bytes)

    def borrow(self) -> Region | None:
        """A free slot claimed for a worker task's batches to be gathered into (the source
        takes it as its buffer slot: stoker.loader.read.arrow.ArrowSource.fetch_group), so
        :meth:`put_group` sends them without copying; ``None`` when no slot is free. The
        worker hands it to :meth:`put_group` or back with :meth:`give_back`."""
        slot = self._claim()
        return None if slot is None else Region(self, slot)

    def give_back(self, region: Region) -> None:
        """Free a borrowed slot that no message refers to."""
        self._state[region.slot] = _FREE

    def put_group(self, items: Sequence[tuple[Any, list[tuple[str, torch.Tensor]]]],
                  region: Region) -> bytes | None:
        """One message for several plain answers (a group task's batches, each with its
        :meth:`plain` tensors) in ``region``'s slot: tensors already in it stay where they
        are (found by address: no NumPy array is made for them), the others are copied in.
        ``None`` when they do not fit (the caller then :meth:`put`s each and gives
        ``region`` back).

        Per batch, a message cost the worker a pipe write (~30 us) and the consumer a poll,
        a read and a rebuild; with two process workers on two cores the consumer was the
        bound and the workers waited for tasks (W1, 5 M rows, natural order, cProfile: 0.55
        of the workers' 1.86 s in ``poll``). The batches of a group lend the slot together:
        it is free again once the last view of any of them is collected."""
        heads = []
        for (key, answer), plain in items:
            layout = []
            for name, t in plain:
                at = region.offset_at(t.data_ptr(), t.nbytes)
                if at is None:
                    at = region.copy_in(t.numpy())
                if at is None:  # does not fit
                    return None
                layout.append((name, _numpy_str(t.dtype), tuple(t.shape), at))
            heads.append((key, type(answer), tuple(answer[1:]), layout))
        self._stamp_slot(region.slot, sum(len(h[3]) for h in heads))
        return _GROUP + _PLAIN_HEAD.pack(self._stamp, region.slot) + \
            pickle.dumps(heads, protocol=5)

    def put(self, obj: Any) -> bytes:
        """What the worker sends through the pipe for ``obj``: a slot reference after writing
        ``obj`` into the lowest free slot (its pages are the likeliest to be warm), or the
        whole pickle when it does not fit a slot.

        A plain answer (:func:`_plain`, every stoker batch without user code) is not pickled:
        its arrays are copied into the slot and the pipe carries their names, dtypes and
        shapes: pickling a W1 batch into the slot cost the worker ~27 us besides its ~30 us
        copy (W1 12,475 against 9,760 batches/s, the consumer 47 against 55 us of CPU per
        batch, bench/transport_bench.py)."""
        tensors = _plain(obj, self.slot_bytes)
        arrays = None if tensors is None else [(name, t.numpy()) for name, t in tensors]
        if arrays is not None:
            sizes = [a.nbytes for _, a in arrays]
            parts = [a.reshape(-1).view(np.uint8) for _, a in arrays]
        else:
            buffers: list[pickle.PickleBuffer] = []
            buf = io.BytesIO()
            _RingPickler(buf, buffers.append, self.slot_bytes).dump(obj)
            parts = [np.frombuffer(p, dtype=np.uint8)
                     for p in (buf.getbuffer(), *(b.raw() for b in buffers))]
            sizes = [p.nbytes for p in parts]
        offsets = _offsets(sizes)
        slot = self._claim(len(sizes)) if offsets[-1] <= self.slot_bytes else None
        if slot is None:
            return dumps(obj)
        base = slot * self.slot_bytes
        for part, at, n in zip(parts, offsets[:-1], sizes):
            self._view[base + at:base + at + n] = part
        if arrays is not None:  # a group of one answer, read as such (loads)
            key, answer = obj
            layout = [(name, a.dtype.str, a.shape, at) for (name, a), at in zip(arrays, offsets)]
            return _PLAIN + _PLAIN_HEAD.pack(self._stamp, slot) + pickle.dumps(
                [(key, type(answer), tuple(answer[1:]), layout)], protocol=5)
        return _REF + struct.pack(f"<QQQ{len(sizes)}Q", self._stamp, slot, len(sizes), *sizes)

    def _claim(self, count: int | None = None) -> int | None:
        """The lowest free slot, marked written (and stamped for ``count`` buffers when
        given); ``None`` when every slot is in use."""
        free = np.flatnonzero(self._state == _FREE)
        if not len(free):  # cannot happen while the reader keeps to its limits
            note("ring_full", f"all {self.slots} slots of a worker's ring were in use")
            return None
        slot = int(free[0])
        self._state[slot] = _WRITTEN
        if count is not None:
            self._stamp_slot(slot, count)
        return slot

    def _stamp_slot(self, slot: int, count: int) -> None:
        """Write the header of a slot about to be announced: the next stamp, ``count``."""
        self._stamp += 1
        base = slot * self.slot_bytes
        self._view[base:base + _HEAD.size] = np.frombuffer(_HEAD.pack(self._stamp, count),
                                                           dtype=np.uint8)

    def loads(self, raw: bytes) -> Any:
        """The object behind ``raw`` (a slot reference or a whole pickle). Its buffers view
        the slot, lent until the last of them is collected, while fewer than ``leases`` slots
        are lent; otherwise each is copied out and the slot is free again at once."""
        if raw[:1] in (_PLAIN, _GROUP):
            stamp, slot = _PLAIN_HEAD.unpack_from(raw, 1)
            heads = pickle.loads(raw[1 + _PLAIN_HEAD.size:])
            layouts = [[(name, np.dtype(dtype), shape, at) for name, dtype, shape, at in h[3]]
                       for h in heads]
            spans = [(at, math.prod(shape) * dt.itemsize) for layout in layouts
                     for _, dt, shape, at in layout]
            parts = iter(self._read(stamp, slot, spans, len(heads)))
            answers = [(key, kind._make([{name: torch.from_numpy(next(parts).view(dt)
                                                                 .reshape(shape))
                                          for name, dt, shape, _ in layout}, *rest]))
                       for (key, kind, rest, _), layout in zip(heads, layouts)]
            return Answers(answers) if raw[:1] == _GROUP else answers[0]
        if raw[:1] != _REF:
            return ForkingPickler.loads(raw)
        stamp, slot, count = struct.unpack_from("<QQQ", raw, 1)
        sizes = struct.unpack_from(f"<{count}Q", raw, 25)
        parts = self._read(stamp, slot, list(zip(_offsets(sizes)[:-1], sizes)))
        return ForkingPickler.loads(parts[0].tobytes(), buffers=parts[1:])

    def _read(self, stamp: int, slot: int, spans: Sequence[tuple[int, int]], batches: int = 1
              ) -> list[np.ndarray]:
        """The buffers ``(offset, bytes)`` of ``slot`` (``batches`` batches'): views of the
        lent slot, or copies (the slot is then free again) once ``leases`` slots are lent."""
        base = slot * self.slot_bytes
        if self._state[slot] != _WRITTEN or \
                _HEAD.unpack_from(self._map, base) != (stamp, len(spans)):
            raise RingError(f"ring slot {slot} holds another batch than the one announced "
                            f"({stamp}): it was overwritten before it was read")
        lend = self.leases and np.count_nonzero(self._state == _LENT) < self.leases
        if lend:
            self._state[slot] = _LENT
            view = np.frombuffer(self._lent.lend(self._map, base, self._state, slot),
                                 dtype=np.uint8)
            base = 0
        else:
            view = self._view
            for _ in range(batches if self.leases else 0):
                note("batch_copied", f"{self.leases} slots of one worker were held at once")
        parts = [view[base + at:base + at + n] if lend else view[base + at:base + at + n].copy()
                 for at, n in spans]
        if not lend:
            self._state[slot] = _FREE
        return parts

    def close(self) -> None:
        """Unmap the slots (the consumer, when the worker is gone), or, while something still
        views them (a frame kept by an exception's traceback), when that view is collected."""
        self._view = self._state = None
        try:
            self._map.close()
        except BufferError:  # exported: the mapping goes with its last view, nothing is lost
            return


class Region:
    """A borrowed ring slot as a buffer slot of the fast path (the interface of
    stoker.loader.fastpath.ring.Slot): :meth:`array` hands out its bytes after the header,
    one aligned piece per name, so a batch gathered into it is already where the consumer
    reads it. An array that does not fit is private memory (copied in by ``put_group`` if
    room is left)."""

    def __init__(self, ring: Ring, slot: int) -> None:
        self.ring, self.slot = ring, slot
        self.used = _ALIGN  # bytes handed out, the header's included
        self._named: dict[str, tuple[int, int]] = {}  # name -> (offset, bytes)
        self._base = slot * ring.slot_bytes
        self._addr = ring._view.__array_interface__["data"][0] + self._base

    def _bytes(self, at: int, n: int) -> np.ndarray:
        return self.ring._view[self._base + at:self._base + at + n]

    def _take(self, n: int) -> int | None:
        at, end = self.used, self.used + -(-n // _ALIGN) * _ALIGN
        if end > self.ring.slot_bytes:
            return None
        self.used = end
        return at

    def array(self, name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """A C-contiguous ``shape``/``dtype`` array in this slot (the piece ``name`` had, if
        it is large enough)."""
        dtype = np.dtype(dtype)
        n = math.prod(shape) * dtype.itemsize
        at, size = self._named.get(name, (None, 0))
        if at is None or size < n:
            at = self._take(n)
            if at is None:
                return np.empty(shape, dtype)
            self._named[name] = (at, n)
        return self._bytes(at, n).view(dtype).reshape(shape)

    def offset_at(self, address: int, nbytes: int) -> int | None:
        """Where the ``nbytes`` at ``address`` lie in this slot's handed-out bytes, or
        ``None``."""
        at = address - self._addr
        return at if nbytes and _ALIGN <= at and at + nbytes <= self.used else None

    def copy_in(self, array: np.ndarray) -> int | None:
        """Copy ``array`` into free bytes of this slot: its offset, or ``None`` if full."""
        at = self._take(array.nbytes)
        if at is not None:
            self._bytes(at, array.nbytes)[:] = array.reshape(-1).view(np.uint8)
        return at


def _offsets(sizes: Sequence[int]) -> list[int]:
    """Where each buffer of a slot starts (after the header, each aligned), then the end."""
    out = [_ALIGN]
    for n in sizes:
        out.append(out[-1] + -(-n // _ALIGN) * _ALIGN)
    return out


@functools.cache
def _lent_type(slot_bytes: int) -> type:
    """A ctypes view of one slot whose collection frees the slot: the first object below a
    lent batch's arrays that is not an array (NumPy's base chain ends there), so it lives
    exactly as long as any of them."""

    class Lent(ctypes.c_char * slot_bytes):  # type: ignore[misc, valid-type]
        __slots__ = ("_owner", "_slot", "_state")

        @classmethod
        def lend(cls, mapping: mmap.mmap, base: int, state: np.ndarray, slot: int) -> "Lent":
            lent = cls.from_buffer(mapping, base)
            lent._owner, lent._slot, lent._state = os.getpid(), slot, state
            return lent

        def __del__(self) -> None:
            if os.getpid() == self._owner:  # not a forked child's copy of the reference
                self._state[self._slot] = _FREE

    return Lent
