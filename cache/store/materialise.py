"""Rewrite a zstd-compressed Arrow IPC shard as an uncompressed one, batch for batch.

Arrow's IPC buffer compression must be undone on every read; an uncompressed IPC file can be
memory-mapped and read zero-copy. The record batches (and so the manifest's ``batch_rows``)
stay exactly the same, which is what the loader seeks by.
"""

from __future__ import annotations

import os
from typing import Callable

import pyarrow as pa

__all__ = ["materialise"]

# Upper bounds of what the IPC writer adds to the buffers themselves: padding plus a buffer
# descriptor per buffer, a message header per batch, magic + schema + footer per file.
_PER_BUFFER = 80
_PER_BATCH = 512
_FIXED = 4096


def materialise(src: str, reserve: Callable[[int], str]) -> str:
    """Decompress the IPC file ``src`` into a new file and return its path.

    ``reserve(nbytes)`` is called once, with an upper bound of the output size, before any
    byte is written; it returns the path to write (so the caller can account the bytes as
    in flight before they exist).
    """
    with pa.memory_map(src) as source:
        reader = pa.ipc.open_file(source)
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        bound = _FIXED + 2 * reader.schema.serialize().size + sum(b.get_total_buffer_size()
                             + _PER_BUFFER * sum(len(c.buffers()) for c in b.columns)
                             + _PER_BATCH for b in batches)
        dst = reserve(bound)
        options = pa.ipc.IpcWriteOptions(compression=None)
        with pa.OSFile(dst, "wb") as sink:
            with pa.ipc.new_file(sink, reader.schema, options=options) as writer:
                for batch in batches:
                    writer.write_batch(batch)
        del batches
    with open(dst, "rb+") as f:
        os.fsync(f.fileno())
    return dst
