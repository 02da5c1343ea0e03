"""A Parquet file read through one byte span already in memory: the bytes that were checked.

Before a row group of indexed Parquet is decoded its bytes are hashed against the index
(stoker.loader.read.indexed.source); reading them to hash and then again to decode cost two
copies out of the page cache, and, past memory, a second disk read of bytes the page cache had
dropped in between (20 M W1 rows in a 6 GiB cgroup, a node's first run: 12.9 GB read from disk
for a 9.3 GB file). The check keeps the span it read, and the decode reads the file through
:class:`SpanFile`, which serves reads inside the span from it (zero-copy: pyarrow wraps the
returned view) and any other read from the file itself. So the bytes decoded are the bytes
hashed, even if the file changes on disk in between.
"""

from __future__ import annotations

import io
import os

import numpy as np

from stoker.loader.fastpath.ring import BufferRing

__all__ = ["SpanFile", "read_span"]


def read_span(fd: int, start: int, end: int, buffers: BufferRing) -> np.ndarray:
    """Bytes ``[start, end)`` of the open file ``fd`` (fewer if it ends first: a truncated
    file then hashes differently from its index), in a buffer of ``buffers``: it is written
    again only once no view of it is alive (a fresh 30 MB buffer per row group faulted its
    pages in every time)."""
    slot = buffers.acquire()
    try:
        buf = slot.array("span", (end - start,), np.uint8)
    finally:
        buffers.release(slot)
    got = 0
    while got < len(buf):
        n = os.preadv(fd, [buf[got:]], start + got)
        if n == 0:
            return buf[:got]
        got += n
    return buf


class SpanFile(io.RawIOBase):
    """File ``path`` (``size`` bytes) whose bytes ``[start, start + len(span))`` are read
    from ``span``; pass it to pyarrow as ``pa.PythonFile(SpanFile(...), mode="r")``."""

    def __init__(self, path: str, size: int, start: int, span: np.ndarray) -> None:
        super().__init__()
        self._path, self._size, self._start = path, size, start
        self._span = memoryview(span)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def size(self) -> int:
        return self._size

    def read(self, n: int | None = -1) -> bytes | memoryview:  # type: ignore[override]
        if n is None or n < 0:
            n = self._size - self._pos
        lo = self._pos - self._start
        if 0 <= lo and lo + n <= len(self._span):
            self._pos += n
            return self._span[lo:lo + n]
        fd = os.open(self._path, os.O_RDONLY)  # rare (the footer comes parsed): no fd kept
        try:
            data = os.pread(fd, n, self._pos)
        finally:
            os.close(fd)
        self._pos += len(data)
        return data
