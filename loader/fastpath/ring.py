"""A ring of batch buffers allocated once and reused, pinned when CUDA is available.

The fast path writes every batch straight into the arrays of one *slot*; the tensors handed
to the user are views of those arrays. Allocating fresh arrays per batch costs page faults
(half of memcpy bandwidth here, see shared/FIELD-NOTES.md) and, with CUDA, a pinned
allocation per batch is far slower still.

Reuse rule (no aliasing, whatever the user keeps): a slot is recycled only when **no view of
its arrays is alive anywhere** — the ring checks the reference counts of its arrays. A
training loop that drops each batch before the next one arrives therefore cycles through
``in-flight + 2`` slots with no allocation at all; a user who keeps batches (``list(loader)``)
simply gets fresh slots, so a batch you still hold is never overwritten. The ring holds at
most ``depth`` slots; when all of them are in use a one-off slot is allocated and dropped
after use.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import math
import mmap
import os
import sys
import threading
from typing import Any

import numpy as np

from stoker.loader import fallbacks

__all__ = ["BufferRing", "Slot", "fresh_pages", "libc_fn", "populate"]

_PAGES_FROM = 1 << 20  # buffers from this size on are plain populated pages (fresh_pages)


def fresh_pages(nbytes: int, faulted: bool = True) -> np.ndarray:
    """``nbytes`` uninitialised bytes in plain anonymous pages, faulted in at once (unless
    not ``faulted``: then as they are first written, or a range at a time by :func:`populate`).

    Not ``np.empty``: NumPy advises huge pages for large arrays, and with the kernel's
    ``defrag=madvise`` setting every fault then compacts memory; measured here a shard's copy
    took 3x longer that way (a fresh 26 MB buffer written whole: 20.7 ms against 9.1 ms
    here), and the gathers were no faster with huge pages. Pages are populated up front
    (``MAP_POPULATE``, half the cost of one fault per page): the caller writes all of them.
    """
    flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0) | \
        (getattr(mmap, "MAP_POPULATE", 0) if faulted else 0)
    try:
        region = mmap.mmap(-1, nbytes, flags=flags)
    except (OSError, ValueError, TypeError):  # a platform without these flags
        region = mmap.mmap(-1, nbytes)
    return np.frombuffer(region, dtype=np.uint8)


@functools.lru_cache(maxsize=None)
def _libc() -> ctypes.CDLL | None:
    path = ctypes.util.find_library("c")  # runs ldconfig: once per process
    return ctypes.CDLL(path, use_errno=True) if path else None


@functools.lru_cache(maxsize=None)
def libc_fn(name: str, *argtypes: type) -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """libc's ``name`` with its argument types set, looked up once (a round calls ``mincore``
    once per run)."""
    lib = _libc()
    if lib is None or not hasattr(lib, name):
        return None
    fn = getattr(lib, name)
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn


_POPULATE_WRITE = 23  # MADV_POPULATE_WRITE (Linux 5.14)
_populating: list[bool] = [True]  # until the kernel refuses once


def populate(arr: np.ndarray) -> bool:
    """Fault in the pages of the contiguous ``arr`` (in memory from :func:`fresh_pages`, not
    yet ``faulted``, or a file's shared map about to be written) in one call that gives the
    GIL up, as ``MAP_POPULATE`` does for a whole map: a records build of one range at a time
    pays for its own pages on its own thread.
    Whether the kernel did; a kernel without it (before Linux 5.14) is the counted fallback
    ``"no_populate"``, once per process: the pages then fault in as they are written."""
    fn = libc_fn("madvise", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    if not _populating[0] or fn is None or not arr.nbytes:
        return False
    lo = arr.ctypes.data // mmap.PAGESIZE * mmap.PAGESIZE
    if fn(lo, arr.ctypes.data + arr.nbytes - lo, _POPULATE_WRITE) == 0:
        return True
    err = ctypes.get_errno()
    _populating[0] = False
    fallbacks.note("no_populate", f"madvise(MADV_POPULATE_WRITE) of {arr.nbytes} bytes failed: "
                                  f"{errno.errorcode.get(err, err)} {os.strerror(err)}")
    return False


def _refs(arr: np.ndarray) -> list[np.ndarray]:
    """``arr`` and the ndarrays it views: a user view may reference any of them."""
    chain = [arr]
    while isinstance(chain[-1].base, np.ndarray):
        chain.append(chain[-1].base)
    return chain


def _counts(buffers: dict[str, np.ndarray], name: str) -> list[int]:
    # Always called the same way, so the ring's own references add the same amount each time.
    return [sys.getrefcount(a) for a in _refs(buffers[name])]


class Slot:
    """Named, grow-only flat buffers; :meth:`array` returns a view of the requested shape."""

    def __init__(self, pin: bool) -> None:
        self._pin = pin
        self._buffers: dict[str, np.ndarray] = {}
        self._baseline: dict[str, list[int]] = {}
        self.busy = False

    def _allocate(self, nbytes: int) -> np.ndarray:
        if self._pin:
            import torch

            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).numpy()
        return fresh_pages(nbytes) if nbytes >= _PAGES_FROM else np.empty(nbytes, np.uint8)

    def array(self, name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """A C-contiguous ``shape``/``dtype`` array backed by this slot's buffer ``name``."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        old = self._buffers.get(name)
        if old is None or old.nbytes < nbytes:
            # grow by 1.5x so a slowly growing width (list, binary) settles quickly
            size = max(nbytes, int(old.nbytes * 1.5) if old is not None else 0, 64)
            del old
            self._buffers[name] = self._allocate(size)
            self._baseline[name] = _counts(self._buffers, name)
        return self._buffers[name][:nbytes].view(dtype).reshape(shape)

    def in_use(self) -> bool:
        """Whether this slot is being filled or some view of its memory is alive."""
        if self.busy:
            return True
        return any(now > then for name in self._buffers
                   for now, then in zip(_counts(self._buffers, name), self._baseline[name]))

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._buffers.values())


class BufferRing:
    """At most ``depth`` reusable slots (see the module docstring for the reuse rule).

    Args:
        depth: slots kept for reuse; size it ``in-flight batches + 2``.
        pin: allocate page-locked memory (only when CUDA is available).
    """

    def __init__(self, depth: int = 8, pin: bool = False) -> None:
        if depth < 1:
            raise ValueError(f"depth={depth!r} must be >= 1 (slots kept for reuse)")
        self.depth = depth
        self.pin = pin
        self._slots: list[Slot] = []
        self._lock = threading.Lock()
        self.allocations = 0  # slots ever created: stays flat in the steady state

    def acquire(self) -> Slot:
        """A slot nobody else uses; return it with :meth:`release` once the batch is built."""
        with self._lock:
            for slot in self._slots:
                if not slot.in_use():
                    slot.busy = True
                    return slot
            slot = Slot(self.pin)
            slot.busy = True
            self.allocations += 1
            if len(self._slots) < self.depth:
                self._slots.append(slot)
            return slot

    def release(self, slot: Slot) -> None:
        """The batch in ``slot`` is built; from now on only live views keep it in use."""
        with self._lock:
            slot.busy = False

    def __len__(self) -> int:
        return len(self._slots)
