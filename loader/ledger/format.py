"""Ledger file format ``stoker-ledger/1``: framing, step records, digests.

A ledger is an append-only file written by one rank of one run. Layout (all integers
little-endian)::

    magic  b"STOKERL1"                                   8 bytes, once
    frame  kind:u8  raw_len:u32  comp_len:u32  check:u64  payload[comp_len]   repeated

``payload`` is one zstd frame (``zstandard``, level 3) that decompresses to ``raw_len`` bytes;
``check`` is the xxh3-64 of the compressed payload. A reader stops at the first frame that is
incomplete or fails its check: everything before it is intact, so a writer killed with SIGKILL
leaves a file readable up to its last complete frame (the writer appends whole frames with one
``write`` each, flushed every ``flush_steps`` steps or ``flush_seconds`` seconds).

Frame kinds:

* ``HEADER`` (1): canonical JSON object (what the run was: dataset, fingerprint, seed, order
  options, batch geometry, versions, host, start time). Every time a writer opens the file a
  new *segment* starts with a header frame: a resumed run appends to the ledger it resumes.
* ``STEPS`` (2): ``n:u32`` then the step records column by column (column order compresses
  far better than row order: epoch, rank and count are nearly constant)::

      epoch u32[n] | step u32[n] | rank u16[n] | count u32[n] | digest u64[n]
      | wait_s f32[n] | between_s f32[n]        (30 bytes per step before compression)

  then, only when the segment header says ``"ids": true``, the ``sum(count)`` sample ids
  as int64; then, only when the header has ``"content": {"columns": [C names], ...}``, the
  content digests as u64[n, C] (step-major): one digest per step and column of the batch as
  delivered (:mod:`stoker.loader.ledger.digest`).
* ``EVENTS`` (3): JSON list of objects ``{"kind", "at", "time", ...data}`` where ``at`` is
  the number of steps the segment had recorded when the event happened and ``time`` the
  seconds since the segment started.
* ``END`` (4): JSON object written by a clean ``close()`` (step and event totals); a segment
  without it ended with its process.

``digest`` is the xxh3-64 of the step's sample ids as little-endian int64 bytes
(:func:`ids_digest`), so an audit can compare what was consumed with a replay of the order
without storing the ids themselves.

Worked example: one step (epoch 0, step 3, rank 0, ids ``[7, 2]``, waited 1 ms, 20 ms since the
previous batch) is the record ``(0, 3, 0, 2, xxh3_64(b"\\x07\\0\\0\\0\\0\\0\\0\\0\\x02\\0..."),
0.001, 0.02)``; with real timings a frame of 1024 steps takes about 18.5 bytes per step on
disk (bench/bench_ledger.py).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import numpy as np
import xxhash
import zstandard

from stoker.manifest import StokerError

__all__ = [
    "FRAME_END",
    "FRAME_EVENTS",
    "FRAME_HEADER",
    "FRAME_STEPS",
    "LEDGER_FORMAT",
    "LedgerError",
    "MAGIC",
    "STEP_DTYPE",
    "decode_steps",
    "encode_frame",
    "encode_steps",
    "ids_digest",
    "iter_frames",
]

LEDGER_FORMAT = "stoker-ledger/1"
MAGIC = b"STOKERL1"
FRAME_HEADER, FRAME_STEPS, FRAME_EVENTS, FRAME_END = 1, 2, 3, 4
_KINDS = (FRAME_HEADER, FRAME_STEPS, FRAME_EVENTS, FRAME_END)
_FRAME = struct.Struct("<BIIQ")
_MAX_RAW = 1 << 31



class LedgerError(StokerError):
    """A ledger cannot be written or read (unusable path, not a ledger, closed writer)."""


_STEP_FIELDS = (("epoch", "<u4"), ("step", "<u4"), ("rank", "<u2"), ("count", "<u4"),
                ("digest", "<u8"), ("wait_s", "<f4"), ("between_s", "<f4"))
STEP_DTYPE = np.dtype(list(_STEP_FIELDS))
_COUNT = struct.Struct("<I")


def ids_digest(ids: np.ndarray) -> int:
    """xxh3-64 of ``ids`` as little-endian int64 bytes (the per-step digest)."""
    return xxhash.xxh3_64_intdigest(np.ascontiguousarray(ids, dtype="<i8").tobytes())


def encode_frame(kind: int, raw: bytes, level: int = 3) -> bytes:
    """One complete frame: header, then ``raw`` compressed as a single zstd frame."""
    payload = zstandard.ZstdCompressor(level=level).compress(raw)
    return _FRAME.pack(kind, len(raw), len(payload), xxhash.xxh3_64_intdigest(payload)) + payload


def encode_steps(records: np.ndarray, ids: np.ndarray | None,
                 content: np.ndarray | None = None) -> bytes:
    """Raw ``STEPS`` payload: count, the columns of ``records`` (STEP_DTYPE), then ids, then
    content digests (u64 ``[n, C]``)."""
    parts = [_COUNT.pack(len(records))]
    parts += [np.ascontiguousarray(records[name]).tobytes() for name, _ in _STEP_FIELDS]
    if ids is not None:
        parts.append(np.ascontiguousarray(ids, dtype="<i8").tobytes())
    if content is not None:
        parts.append(np.ascontiguousarray(content, dtype="<u8").tobytes())
    return b"".join(parts)


def decode_steps(raw: bytes, with_ids: bool, content_columns: int = 0
                 ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Inverse of :func:`encode_steps`: ``(records, ids, content)``; raises ``ValueError`` on a
    malformed payload."""
    (n,) = _COUNT.unpack_from(raw, 0)
    records = np.empty(n, dtype=STEP_DTYPE)
    offset = _COUNT.size
    for name, code in _STEP_FIELDS:
        dt = np.dtype(code)
        size = n * dt.itemsize
        if offset + size > len(raw):
            raise ValueError(f"steps payload ends inside column {name!r}")
        records[name] = np.frombuffer(raw, dtype=dt, count=n, offset=offset)
        offset += size
    ids = content = None
    tail = 8 * n * content_columns
    if with_ids:
        total = int(records["count"].sum(dtype=np.int64))
        if offset + 8 * total + tail != len(raw):
            raise ValueError(f"steps payload holds {len(raw) - offset - tail} id bytes, "
                             f"expected {8 * total}")
        ids = np.frombuffer(raw, dtype="<i8", count=total, offset=offset).astype(np.int64)
        offset += 8 * total
    if offset + tail != len(raw):
        raise ValueError(f"steps payload has {len(raw) - offset} bytes after the step records, "
                         f"expected {tail} of content digests")
    if content_columns:
        content = np.frombuffer(raw, dtype="<u8", count=n * content_columns, offset=offset) \
            .astype(np.uint64).reshape(n, content_columns)
    return records, ids, content


def iter_frames(data: bytes | memoryview,
                start: int = len(MAGIC)) -> Iterator[tuple[int, int, int, bytes]]:
    """Yield ``(offset, end, kind, raw)`` for every intact frame from ``start``.

    Stops silently at the first incomplete or damaged frame; the caller compares the last
    frame's end with ``len(data)`` to learn whether (and where) the file is truncated.
    """
    view = memoryview(data)
    offset = start
    dctx = zstandard.ZstdDecompressor()
    while offset + _FRAME.size <= len(view):
        kind, raw_len, comp_len, check = _FRAME.unpack_from(view, offset)
        body = offset + _FRAME.size
        if kind not in _KINDS or raw_len > _MAX_RAW or body + comp_len > len(view):
            return
        payload = view[body:body + comp_len]
        if xxhash.xxh3_64_intdigest(payload) != check:
            return
        try:
            raw = dctx.decompress(payload, max_output_size=raw_len)
        except zstandard.ZstdError:
            return
        if len(raw) != raw_len:
            return
        yield offset, body + comp_len, kind, raw
        offset = body + comp_len

