"""Kernel metadata of every record batch of an Arrow IPC file, read from the file's own
flatbuffers in one pass.

The kernels read a column of record batch ``c`` through a row of int64s: the byte offsets
(inside the memory-mapped file) of its validity and value buffers, its type code, and so on
(:class:`~stoker.loader.fastpath.plan.ShardData`). Asking pyarrow for them costs ~2.5 us per
column and record batch (``RecordBatch.column``, ``Array.buffers``, ``null_count``): 8.6 ms
for a W1 shard of 62 record batches and 74 columns, and opening the shards a first staged
round touches is paid before the first batch (a terabyte dataset's first round touches
hundreds of shards). The same numbers are in the file: each record batch's message lists its
field nodes (length, null count) and buffers (offset, length) as flat arrays of int64 pairs,
in schema order. :func:`read_layout` locates them (the footer's blocks, then each message's
flatbuffer tables), and :meth:`IpcLayout.fixed_meta` / :meth:`IpcLayout.var_meta` assemble
a column's rows for all record batches at once with NumPy (1.5 ms for that shard).

A file this does not understand (compressed buffers, a type whose buffer count it does not
know, a message it cannot parse) gives ``None`` and the caller asks pyarrow as before; the
metadata is the same either way (tests/fastpath/test_ipc_meta.py).

:class:`FileBatches`: a file's record batches, each read by pyarrow only when asked for. Opening
a shard needs its layout (for the kernels, the manifest's check and the records), not pyarrow's
record batches: ``read_all`` of a 240 MB W1 shard of 615 record batches took 17-27 ms, a third
of opening a shard whose records the node stores, paid by every process for every shard before
the batches that need it. A shard read through its records or the kernels never asks pyarrow
for its batches; the Arrow path (``take``) and checks that read a column's values ask then
(tests/fastpath/test_file_batches.py).
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass
from typing import Sequence, overload

import numpy as np
import pyarrow as pa

__all__ = ["FileBatches", "IpcLayout", "batch_rows", "message_ranges", "read_layout"]

_MAGIC = b"ARROW1"
_CONTINUATION = 0xFFFFFFFF
_RECORD_BATCH = 3  # MessageHeader.RecordBatch
_u16, _u32, _i32, _i64 = (struct.Struct(f) for f in ("<H", "<I", "<i", "<q"))


class _Unknown(Exception):
    """Something :func:`read_layout` does not parse: the caller asks pyarrow instead."""


def _field(buf: memoryview, table: int, index: int) -> int:
    """Position of field ``index`` of the flatbuffer table at ``table``, or 0 if absent."""
    vtable = table - _i32.unpack_from(buf, table)[0]
    vsize = _u16.unpack_from(buf, vtable)[0]
    if 4 + 2 * index >= vsize:
        return 0
    off = _u16.unpack_from(buf, vtable + 4 + 2 * index)[0]
    return table + off if off else 0


def _target(buf: memoryview, pos: int) -> int:
    return pos + _u32.unpack_from(buf, pos)[0]


def _struct_vector(buf: memoryview, base: int, table: int, index: int) -> np.ndarray:
    """Vector field ``index`` of int64 pairs (``FieldNode``, ``Buffer``) as ``[n, 2]``."""
    pos = _field(buf, table, index)
    if not pos:
        return np.empty((0, 2), dtype=np.int64)
    vec = _target(buf, pos)
    n = _u32.unpack_from(buf, vec)[0]
    return np.frombuffer(buf.obj, dtype="<i8", count=2 * n,  # type: ignore[call-overload]
                         offset=base + vec + 4).reshape(n, 2)


def _buffer_counts(t: pa.DataType) -> list[int]:
    """Buffers of each field node of a column of type ``t``, in the IPC format's order."""
    if pa.types.is_dictionary(t):
        t = t.index_type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [2, *_buffer_counts(t.value_type)]
    if pa.types.is_fixed_size_list(t):
        return [1, *_buffer_counts(t.value_type)]
    if pa.types.is_struct(t):
        return [1] + [n for i in range(t.num_fields) for n in _buffer_counts(t.field(i).type)]
    if pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t) \
            or pa.types.is_large_string(t):
        return [3]
    if pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_floating(t) \
            or pa.types.is_temporal(t) or pa.types.is_decimal(t) \
            or pa.types.is_fixed_size_binary(t):
        return [2]
    raise _Unknown(f"buffer layout of {t}")


@dataclass(frozen=True, slots=True)
class IpcLayout:
    """Where every buffer of every record batch of one IPC file lies.

    Attributes:
        rows: rows of each record batch.
        nodes: ``[batches, nodes, 2]`` field nodes (length, null count), schema pre-order.
        buffers: ``[batches, buffers, 2]`` (file offset, length) of each buffer.
        first_node, first_buffer: index of each top-level column's first node and buffer.
    """

    rows: np.ndarray
    nodes: np.ndarray
    buffers: np.ndarray
    first_node: dict[str, int]
    first_buffer: dict[str, int]

    def fixed_meta(self, node: int, buffer: int, code: int, width: int) -> np.ndarray:
        """``[batches, 4]``: (code, validity offset or -1 without nulls, values offset, 0)."""
        n = len(self.rows)
        valid = np.where(self.nodes[:, node, 1] > 0, self.buffers[:, buffer, 0], -1)
        data = self.buffers[:, buffer + 1, 0]
        self._aligned(data, self.buffers[:, buffer + 1, 1], width)
        return np.stack([np.full(n, code, dtype=np.int64), valid, data,
                         np.zeros(n, dtype=np.int64)], 1)

    def var_meta(self, node: int, buffer: int, big: bool, child: tuple[int, int] | None
                 ) -> np.ndarray:
        """``[batches, 4 + 4]`` of a list column (``child``: its values' (code, width)) or
        ``[batches, 5]`` of a binary/string column, as pyarrow's buffers would give."""
        n = len(self.rows)
        valid = np.where(self.nodes[:, node, 1] > 0, self.buffers[:, buffer, 0], -1)
        offsets = self.buffers[:, buffer + 1, 0]
        self._aligned(offsets, self.buffers[:, buffer + 1, 1], 8 if big else 4)
        head = [valid, offsets, np.full(n, int(big), dtype=np.int64), np.zeros(n, dtype=np.int64)]
        if child is None:
            return np.stack(head + [self.buffers[:, buffer + 2, 0]], 1)
        return np.concatenate([np.stack(head, 1),
                               self.fixed_meta(node + 1, buffer + 2, *child)], 1)

    @staticmethod
    def _aligned(offsets: np.ndarray, lengths: np.ndarray, width: int) -> None:
        """Raises ``ValueError`` for a non-empty buffer the kernels cannot read as ``width``-byte
        values in place (the caller reads such a shard through pyarrow)."""
        bad = np.flatnonzero((offsets % width != 0) & (lengths > 0))
        if len(bad):
            raise ValueError(f"a buffer at file offset {int(offsets[bad[0]])} is not "
                             f"{width}-byte aligned in the memory-mapped shard")


def read_layout(arena: pa.Buffer, schema: pa.Schema) -> IpcLayout | None:
    """The layout of the IPC file ``arena`` (all its bytes) with ``schema``, or ``None`` when
    the file holds something this module does not parse (see the module docstring)."""
    try:
        return _read(memoryview(arena), schema)
    except (_Unknown, struct.error, ValueError, IndexError):
        return None


def message_ranges(arena: pa.Buffer) -> np.ndarray | None:
    """Byte ranges (int64 ``[2, n]``, start and end) of the IPC file ``arena``'s footer and of
    every record batch's message metadata: what pyarrow reads to open the file. ``None`` when
    the file is not one this module parses."""
    buf = memoryview(arena)
    try:
        footer, blocks = _blocks(buf)
    except (_Unknown, struct.error, ValueError, IndexError):
        return None
    starts = np.concatenate([[footer], blocks[:, 0]])
    ends = np.concatenate([[len(buf)], blocks[:, 0] + (blocks[:, 1] & 0xFFFFFFFF)])
    return np.stack([starts, ends]).astype(np.int64)


def _blocks(buf: memoryview) -> tuple[int, np.ndarray]:
    """The footer's position and its record-batch blocks (``[count, 3]``: offset,
    metaDataLength, bodyLength)."""
    size = len(buf)
    if size < 18 or bytes(buf[size - 6:]) != _MAGIC:
        raise _Unknown("not an IPC file")
    footer_len = _i32.unpack_from(buf, size - 10)[0]
    footer = size - 10 - footer_len
    pos = _field(buf, _target(buf, footer), 3)  # Footer.recordBatches: [Block]
    if not pos:
        raise _Unknown("no record batches")
    vec = _target(buf, pos)
    count = _u32.unpack_from(buf, vec)[0]
    # Block: offset i64, metaDataLength i32 (+4 padding), bodyLength i64
    blocks = np.frombuffer(buf.obj, dtype="<i8", count=3 * count,  # type: ignore[call-overload]
                           offset=vec + 4).reshape(count, 3)
    return footer, blocks


def _read(buf: memoryview, schema: pa.Schema) -> IpcLayout:
    size = len(buf)
    _, blocks = _blocks(buf)
    count = len(blocks)
    counts = [_buffer_counts(f.type) for f in schema]
    first_node, first_buffer = {}, {}
    nodes_total = buffers_total = 0
    for f, c in zip(schema, counts):
        first_node[f.name], first_buffer[f.name] = nodes_total, buffers_total
        nodes_total += len(c)
        buffers_total += sum(c)
    try:
        rows, nodes, buffers = _messages_at_once(buf, blocks, nodes_total, buffers_total)
    except _Unknown:  # something the vectorised reading does not assume: message by message
        rows, nodes, buffers = _messages(buf, blocks, nodes_total, buffers_total)
    if (buffers[..., 0] + buffers[..., 1] > size).any() or (buffers < 0).any():
        raise _Unknown("a buffer outside the file")
    return IpcLayout(rows, nodes, buffers, first_node, first_buffer)


class _Reader:
    """Little-endian integers at many absolute positions of ``buf`` at once, each read only
    inside its own message's metadata ``[lo, hi)`` (else :class:`_Unknown`)."""

    def __init__(self, buf: memoryview, lo: np.ndarray, hi: np.ndarray) -> None:
        self.u8 = np.frombuffer(buf.obj, dtype=np.uint8)  # type: ignore[call-overload]
        self.lo, self.hi = lo, hi

    def int(self, pos: np.ndarray, width: int, signed: bool = False) -> np.ndarray:
        if ((pos < self.lo) | (pos + width > self.hi)).any():
            raise _Unknown("a flatbuffer offset outside its message")
        raw = self.u8[pos[:, None] + np.arange(width)]
        dtype = f"<{'i' if signed else 'u'}{width}"
        return raw.view(dtype).reshape(len(pos)).astype(np.int64)

    def field(self, table: np.ndarray, index: int) -> np.ndarray:
        """:func:`_field` of every message: the position of field ``index``, or 0."""
        vtable = table - self.int(table, 4, signed=True)
        has = 4 + 2 * index < self.int(vtable, 2)
        at = self.int(np.where(has, vtable + 4 + 2 * index, vtable), 2)
        return np.where(has & (at != 0), table + at, 0)

    def target(self, pos: np.ndarray) -> np.ndarray:
        return pos + self.int(pos, 4)


def _messages_at_once(buf: memoryview, blocks: np.ndarray, nodes_total: int,
                      buffers_total: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_messages`, every message's flatbuffer walked at once with NumPy (a 240 MB W1
    shard of 615 record batches: 2.5-4 ms against 8-11 ms message by message, 13-15 ms
    against 22 ms in a fresh process, whose first touch of each new page is a fault; the
    largest part of opening a shard whose records are stored). Raises :class:`_Unknown`
    where it assumes more than the loop: every message's field nodes and buffers 8-byte
    aligned in the file, every field present."""
    offset = blocks[:, 0].astype(np.int64)
    end = offset + (blocks[:, 1] & 0xFFFFFFFF)
    marker = _Reader(buf, offset, end).int(offset, 4)
    start = offset + np.where(marker == _CONTINUATION, 8, 4)
    r = _Reader(buf, start, end)  # each message's flatbuffer, after its marker and length
    msg = r.target(start)
    kind = r.field(msg, 1)
    if not kind.all() or (r.int(kind, 1) != _RECORD_BATCH).any():
        raise _Unknown("a block that is not a record batch")
    header = r.target(r.field(msg, 2))
    if r.field(header, 3).any():
        raise _Unknown("compressed record batch")
    length = r.field(header, 0)
    rows = np.where(length != 0, r.int(np.where(length != 0, length, start), 8, signed=True), 0)
    words = np.frombuffer(buf.obj, dtype="<i8", count=len(buf) // 8)  # type: ignore[call-overload]
    out = []  # rows of a sliding view: no index array, one copy of what is read
    for index, total in ((1, nodes_total), (2, buffers_total)):
        pos = r.field(header, index)
        if not pos.all():
            raise _Unknown("a record batch without its field nodes or buffers")
        vec = r.target(pos)
        if (r.int(vec, 4) != total).any():
            raise _Unknown("field nodes or buffers do not match the schema")
        first = vec + 4
        if (first % 8).any() or (first + 16 * total > end).any():
            raise _Unknown("field nodes or buffers not 8-byte aligned inside the message")
        windows = np.lib.stride_tricks.sliding_window_view(words, 2 * total) if total \
            else np.empty((len(words), 0), dtype=np.int64)
        out.append(windows[first // 8].reshape(len(blocks), total, 2))
    nodes, buffers = out
    buffers[..., 0] += end[:, None]  # a buffer's offset counts from the body
    return rows, nodes, buffers


def _messages(buf: memoryview, blocks: np.ndarray, nodes_total: int,
              buffers_total: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each record batch's rows, field nodes and buffers (file offsets), message by
    message."""
    count = len(blocks)
    rows = np.empty(count, dtype=np.int64)
    nodes = np.empty((count, nodes_total, 2), dtype=np.int64)
    buffers = np.empty((count, buffers_total, 2), dtype=np.int64)
    for i, (offset, meta_len) in enumerate(blocks[:, :2].tolist()):
        meta_len &= 0xFFFFFFFF
        start = offset + (8 if _u32.unpack_from(buf, offset)[0] == _CONTINUATION else 4)
        message = memoryview(buf.obj)[start:offset + meta_len]  # type: ignore[index]
        body = offset + meta_len
        msg = _target(message, 0)
        kind = _field(message, msg, 1)
        if not kind or message[kind] != _RECORD_BATCH:
            raise _Unknown("a block that is not a record batch")
        header = _target(message, _field(message, msg, 2))
        if _field(message, header, 3):  # BodyCompression: buffers are not the values
            raise _Unknown("compressed record batch")
        length = _field(message, header, 0)
        rows[i] = _i64.unpack_from(message, length)[0] if length else 0
        n = _struct_vector(message, start, header, 1)
        b = _struct_vector(message, start, header, 2)
        if n.shape[0] != nodes_total or b.shape[0] != buffers_total:
            raise _Unknown("field nodes or buffers do not match the schema")
        nodes[i] = n
        buffers[i, :, 0] = b[:, 0] + body
        buffers[i, :, 1] = b[:, 1]
    return rows, nodes, buffers


class FileBatches(Sequence[pa.RecordBatch]):
    """The record batches of an IPC file read through ``reader`` whose layout is ``layout``:
    their row counts (:attr:`rows`) from the layout, each batch from pyarrow at its first
    use (then kept: a zero-copy view of the map)."""

    def __init__(self, reader: pa.ipc.RecordBatchFileReader, layout: IpcLayout,
                 arena: pa.Buffer) -> None:
        self._reader, self._arena = reader, arena
        self.layout = layout
        self.schema: pa.Schema = reader.schema
        self.rows: np.ndarray = layout.rows
        self._read: dict[int, pa.RecordBatch] = {}
        self._tables: dict[tuple[str, ...], pa.Table] = {}
        self._lock = threading.Lock()

    @classmethod
    def open(cls, arena: pa.Buffer) -> FileBatches | pa.Table:
        """The batches of the IPC file ``arena``, read lazily when :func:`read_layout` parses
        it; else (compressed buffers, types it does not know) the whole file read now by
        pyarrow, as a table."""
        reader = pa.ipc.open_file(arena)
        layout = read_layout(arena, reader.schema)
        if layout is None:
            return reader.read_all()
        return cls(reader, layout, arena)

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, i: int) -> pa.RecordBatch: ...

    @overload
    def __getitem__(self, i: slice) -> list[pa.RecordBatch]: ...

    def __getitem__(self, i: int | slice) -> pa.RecordBatch | list[pa.RecordBatch]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"record batch {i} of {len(self)}")
        batch = self._read.get(i)
        if batch is None:
            batch = self._read[i] = self._reader.get_batch(i)
        return batch

    def list_width(self, name: str) -> int | None:
        """The common length of every value of list column ``name`` read from its offsets in
        the file (0 when lengths differ, a value is null or there are no rows), as
        stoker.loader.fastpath.rowmajor's ``_list_width`` reads it from pyarrow's arrays;
        ``None`` for a column that is not a variable-length list."""
        t = self.schema.field(name).type
        if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
            return None
        node, buffer = self.layout.first_node[name], self.layout.first_buffer[name] + 1
        if self.layout.nodes[:, node, 1].any() or not self.rows.any():
            return 0
        dtype = np.dtype("<i8" if pa.types.is_large_list(t) else "<i4")
        full = self.layout.buffers[:, buffer, 1] >= (self.rows + 1) * dtype.itemsize
        if not full[self.rows > 0].all():
            return None  # not the offsets this reads: pyarrow's arrays say
        lengths = np.concatenate([
            np.diff(np.frombuffer(self._arena, dtype=dtype, count=rows + 1, offset=at))
            for rows, at in zip(self.rows.tolist(), self.layout.buffers[:, buffer, 0].tolist())
            if rows])
        lo, hi = int(lengths.min()), int(lengths.max())
        return 0 if lo != hi else lo

    def table(self, columns: Sequence[str]) -> pa.Table:
        """The file's ``columns`` as one table (made once per selection)."""
        key = tuple(columns)
        with self._lock:
            table = self._tables.get(key)
            if table is None:
                whole = pa.Table.from_batches(self[:], schema=self.schema)
                table = self._tables[key] = whole.select(list(key))
        return table


def batch_rows(batches: Sequence[pa.RecordBatch]) -> np.ndarray:
    """int64 row counts of ``batches`` (a :class:`FileBatches` knows them without reading)."""
    if isinstance(batches, FileBatches):
        return batches.rows
    return np.array([b.num_rows for b in batches], dtype=np.int64)
