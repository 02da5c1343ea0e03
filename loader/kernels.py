"""Fused Numba gather kernels: rows of memory-mapped Arrow buffers -> preallocated batch arrays.

Every kernel reads one *arena* (the bytes of one memory-mapped shard, seen through ``views``,
a tuple of typed views of the same memory, see :func:`arena_views`) and writes straight into
its output; no intermediate Arrow or NumPy array is built. Rows are described by three
parallel int64 arrays: ``chunk`` (record batch within the shard), ``row`` (row within that
record batch) and ``dest`` (row of the output). Callers pass rows sorted by source position,
so reads walk memory forwards and the hardware prefetcher helps.

Column descriptions (``meta``) hold *byte* offsets into the arena, ``-1`` for "no validity
bitmap", and the Arrow array offset (sliced arrays), per record batch.

Null rule (documented for users): a null numeric value is written as 0 (``False`` for bool,
0 for categorical codes); a null list or binary value is empty. This is what the pyarrow path
(``stoker.loader.convert``) does, so both paths return equal batches.
"""

from __future__ import annotations

import numpy as np

from stoker.loader.jit import kernel

__all__ = ["BOOL", "CODES", "F32", "F64", "I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64",
           "arena_views", "gather_binary", "gather_fixed", "gather_list", "var_lengths"]

# Physical type codes of fixed-width Arrow buffers (index into the ``views`` tuple, except BOOL,
# which is bit-packed and read through the uint8 view).
BOOL, I8, I16, I32, I64, U8, U16, U32, U64, F32, F64 = range(11)
CODES = {np.dtype(np.int8): I8, np.dtype(np.int16): I16, np.dtype(np.int32): I32,
         np.dtype(np.int64): I64, np.dtype(np.uint8): U8, np.dtype(np.uint16): U16,
         np.dtype(np.uint32): U32, np.dtype(np.uint64): U64, np.dtype(np.float32): F32,
         np.dtype(np.float64): F64}
_VIEW_DTYPES = (np.uint8, np.int8, np.int16, np.int32, np.int64, np.uint16, np.uint32,
                np.uint64, np.float32, np.float64)


def arena_views(buf: object) -> tuple[np.ndarray, ...]:
    """Typed zero-copy views of one arena (anything exposing the buffer protocol)."""
    raw = np.frombuffer(buf, dtype=np.uint8)  # type: ignore[call-overload]
    return tuple(raw[: len(raw) // np.dtype(t).itemsize * np.dtype(t).itemsize].view(t)
                 for t in _VIEW_DTYPES)


@kernel
def _valid(u8: np.ndarray, voff: int, k: int) -> bool:
    return voff < 0 or ((u8[voff + (k >> 3)] >> (k & 7)) & 1) == 1


@kernel
def _put(views, code, off, k, out, d, j):  # type: ignore[no-untyped-def]
    """out[d, j] = element ``k`` of the buffer at byte ``off`` with physical type ``code``."""
    u8, i8, i16, i32, i64, u16, u32, u64, f32, f64 = views
    if code == F32:
        out[d, j] = f32[(off >> 2) + k]
    elif code == I64:
        out[d, j] = i64[(off >> 3) + k]
    elif code == F64:
        out[d, j] = f64[(off >> 3) + k]
    elif code == I32:
        out[d, j] = i32[(off >> 2) + k]
    elif code == I16:
        out[d, j] = i16[(off >> 1) + k]
    elif code == I8:
        out[d, j] = i8[off + k]
    elif code == U8:
        out[d, j] = u8[off + k]
    elif code == U16:
        out[d, j] = u16[(off >> 1) + k]
    elif code == U32:
        out[d, j] = u32[(off >> 2) + k]
    elif code == U64:
        out[d, j] = u64[(off >> 3) + k]
    else:  # BOOL, bit-packed
        out[d, j] = (u8[off + (k >> 3)] >> (k & 7)) & 1


@kernel
def gather_fixed(views, meta, chunk, row, dest, out):  # type: ignore[no-untyped-def]
    """Fixed-width columns -> ``out[dest[i], j]`` (cast to ``out``'s dtype; nulls -> 0).

    Args:
        views: :func:`arena_views` of the shard.
        meta: int64 ``[chunks, K, 4]``: (type code, validity byte offset or -1, data byte
            offset, array offset) of column ``j`` in record batch ``c``.
        chunk, row, dest: int64 ``[n]`` row locations and output rows.
        out: ``[B, K]`` output (any numeric dtype).
    """
    u8 = views[0]
    for j in range(meta.shape[1]):  # column-major: each column's reads walk forwards
        for i in range(chunk.shape[0]):
            c = chunk[i]
            k = meta[c, j, 3] + row[i]
            if _valid(u8, meta[c, j, 1], k):
                _put(views, meta[c, j, 0], meta[c, j, 2], k, out, dest[i], j)
            else:
                out[dest[i], j] = 0


@kernel
def _bounds(views, m, k):  # type: ignore[no-untyped-def]
    """(start, end) of variable-length element ``k`` (offsets at byte m[1], 64-bit if m[2])."""
    if m[2]:
        base = m[1] >> 3
        return views[4][base + k], views[4][base + k + 1]
    base = m[1] >> 2
    return np.int64(views[3][base + k]), np.int64(views[3][base + k + 1])


@kernel
def var_lengths(views, meta, chunk, row, dest, lengths):  # type: ignore[no-untyped-def]
    """Lengths of list or binary values (null -> -1) into ``lengths[dest[i]]``.

    ``meta`` is int64 ``[chunks, >=4]``: (validity byte offset or -1, offsets byte offset,
    offsets are 64-bit, array offset, ...).
    """
    u8 = views[0]
    for i in range(chunk.shape[0]):
        m = meta[chunk[i]]
        k = m[3] + row[i]
        if _valid(u8, m[0], k):
            a, b = _bounds(views, m, k)
            lengths[dest[i]] = b - a
        else:
            lengths[dest[i]] = -1


@kernel
def gather_list(views, meta, chunk, row, dest, out):  # type: ignore[no-untyped-def]
    """List values -> padded ``out[dest[i], :]`` (padding and null values -> 0).

    ``meta`` is int64 ``[chunks, 8]``: the four :func:`var_lengths` fields, then the child's
    (type code, validity byte offset or -1, data byte offset, array offset).
    """
    u8 = views[0]
    width = out.shape[1]
    for i in range(chunk.shape[0]):
        m = meta[chunk[i]]
        k = m[3] + row[i]
        n = 0
        d = dest[i]
        if _valid(u8, m[0], k):
            a, b = _bounds(views, m, k)
            n = b - a
            for t in range(n):
                e = m[7] + a + t
                if _valid(u8, m[5], e):
                    _put(views, m[4], m[6], e, out, d, t)
                else:
                    out[d, t] = 0
        for t in range(n, width):
            out[d, t] = 0


@kernel
def gather_binary(views, meta, chunk, row, dest, offsets, out):  # type: ignore[no-untyped-def]
    """Binary values -> ``out[offsets[dest[i]]:offsets[dest[i] + 1]]`` (offsets precomputed).

    ``meta`` is int64 ``[chunks, 5]``: the four :func:`var_lengths` fields, then the data
    byte offset.
    """
    u8 = views[0]
    for i in range(chunk.shape[0]):
        m = meta[chunk[i]]
        k = m[3] + row[i]
        if _valid(u8, m[0], k):
            a, b = _bounds(views, m, k)
            o = offsets[dest[i]]
            src = m[4] + a
            for t in range(b - a):
                out[o + t] = u8[src + t]
