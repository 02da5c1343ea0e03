"""Fused Numba gather kernels: rows of memory-mapped Arrow buffers -> preallocated batch arrays.

Every kernel reads one *arena* (the bytes of one memory-mapped shard, seen through ``views``,
a tuple of typed views of the same memory, see :func:`arena_views`) and writes straight into
its output; no intermediate Arrow or NumPy array is built. Rows are described by three
parallel int64 arrays: ``chunk`` (record batch within the shard), ``row`` (row within that
record batch) and ``dest`` (row of the output). Callers pass rows sorted by source position,
so reads walk memory forwards and the hardware prefetcher helps.

Column descriptions (``meta``) hold *byte* offsets into the arena, ``-1`` for "no validity
bitmap", and the Arrow array offset (sliced arrays), per record batch.

The same ten-way switch on the physical type code appears in :func:`_dispatch`,
:func:`_copy_rows`, :func:`gather_list` and :func:`_list_run` on purpose: each branch must
call its helper with a differently typed view, and the one generic alternative, passing the
helper as a function argument, makes Numba refuse ``cache=True`` (numba/numba#6251), which
the start-up time needs.

Null rule (documented for users): a null numeric value is written as 0 (``False`` for bool,
0 for categorical codes); a null list is empty (its lengths entry is 0); a null binary or
string value is ``None`` in the batch's list (``var_lengths`` marks it -1). This is what the
pyarrow path (``stoker.loader.fastpath.convert``) does, so both paths return equal batches.
"""

from __future__ import annotations

import numpy as np

from stoker.loader.jit.intrinsics import pointer, pointer32, pointer64, prefetch
from stoker.loader.jit.kernel import kernel
from stoker.loader.jit.search import last_at_or_below

__all__ = ["BOOL", "CODES", "F32", "F64", "I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64",
           "arena_views", "columns_to_records", "copy_list_ranges",
           "copy_ranges", "gather_binary", "gather_fixed", "gather_list", "var_lengths"]

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
def _column(src, shift, u8, meta, j, chunk, row, dest, out):  # type: ignore[no-untyped-def]
    """Column ``j`` from the typed view ``src`` (element = byte offset >> ``shift``).

    Three passes keep the gather loop tiny, so many cache misses are in flight at once (a
    random row costs one miss per column; the loop's size bounds how many overlap)."""
    n = chunk.shape[0]
    idx = np.empty(n, dtype=np.int64)
    nulls = False
    for i in range(n):
        c = chunk[i]
        idx[i] = (meta[c, j, 2] >> shift) + meta[c, j, 3] + row[i]
        nulls |= meta[c, j, 1] >= 0
    for i in range(n):
        out[dest[i], j] = src[idx[i]]
    if nulls:
        for i in range(n):
            c = chunk[i]
            v = meta[c, j, 1]
            k = meta[c, j, 3] + row[i]
            if v >= 0 and ((u8[v + (k >> 3)] >> (k & 7)) & 1) == 0:
                out[dest[i], j] = 0


@kernel
def _bool_column(u8, meta, j, chunk, row, dest, out):  # type: ignore[no-untyped-def]
    for i in range(chunk.shape[0]):
        c = chunk[i]
        k = meta[c, j, 3] + row[i]
        v = meta[c, j, 1]
        if v < 0 or ((u8[v + (k >> 3)] >> (k & 7)) & 1) == 1:
            out[dest[i], j] = (u8[meta[c, j, 2] + (k >> 3)] >> (k & 7)) & 1
        else:
            out[dest[i], j] = 0


@kernel
def _dispatch(views, code, meta, j, chunk, row, dest, out):  # type: ignore[no-untyped-def]
    """One column of physical type ``code``: the type switch runs once per column, not per
    value, so each inner loop is a tight, type-specialised gather."""
    u8, i8, i16, i32, i64, u16, u32, u64, f32, f64 = views
    if code == F32:
        _column(f32, 2, u8, meta, j, chunk, row, dest, out)
    elif code == I64:
        _column(i64, 3, u8, meta, j, chunk, row, dest, out)
    elif code == F64:
        _column(f64, 3, u8, meta, j, chunk, row, dest, out)
    elif code == I32:
        _column(i32, 2, u8, meta, j, chunk, row, dest, out)
    elif code == I16:
        _column(i16, 1, u8, meta, j, chunk, row, dest, out)
    elif code == I8:
        _column(i8, 0, u8, meta, j, chunk, row, dest, out)
    elif code == U8:
        _column(u8, 0, u8, meta, j, chunk, row, dest, out)
    elif code == U16:
        _column(u16, 1, u8, meta, j, chunk, row, dest, out)
    elif code == U32:
        _column(u32, 2, u8, meta, j, chunk, row, dest, out)
    elif code == U64:
        _column(u64, 3, u8, meta, j, chunk, row, dest, out)
    else:
        _bool_column(u8, meta, j, chunk, row, dest, out)


#: ``gather_fixed`` copies runs of consecutive rows tile by tile when its rows average at
#: least this many per run (natural order): 2.2x faster for a contiguous 1,024-row W1 batch
#: of 64 float32 columns (75 against 165 us), and never slower from 16 rows per run
_RUN_ROWS = 16
_TILE_ROWS = 256  # rows per tile: 256 rows x 64 float32 = 64 KiB stays in L1/L2


@kernel
def gather_fixed(views, meta, chunk, row, dest, out):  # type: ignore[no-untyped-def]
    """Fixed-width columns -> ``out[dest[i], j]`` (cast to ``out``'s dtype; nulls -> 0).

    Rows that come in runs (consecutive rows of one record batch to consecutive output rows,
    as natural order asks) are copied as :func:`copy_ranges` copies them; scattered rows are
    gathered a column at a time. The values written are the same either way.

    Args:
        views: :func:`arena_views` of the shard.
        meta: int64 ``[chunks, K, 4]``: (type code, validity byte offset or -1, data byte
            offset, array offset) of column ``j`` in record batch ``c``; a column's type code
            is the same in every record batch (one schema per dataset).
        chunk, row, dest: int64 ``[n]`` row locations and output rows.
        out: ``[B, K]`` output (any numeric dtype).
    """
    n = chunk.shape[0]
    if n == 0:
        return
    runs = 1
    for i in range(1, n):
        if chunk[i] != chunk[i - 1] or row[i] != row[i - 1] + 1 or dest[i] != dest[i - 1] + 1:
            runs += 1
    if runs * _RUN_ROWS <= n:
        i = 0
        while i < n:
            k = i + 1
            while k < n and chunk[k] == chunk[i] and row[k] == row[k - 1] + 1 and \
                    dest[k] == dest[k - 1] + 1:
                k += 1
            _copy_rows(views, meta, chunk[i], row[i], k - i, dest[i], _TILE_ROWS, out)
            i = k
        return
    for j in range(meta.shape[1]):  # column-major: each column's reads walk forwards
        _dispatch(views, meta[0, j, 0], meta, j, chunk, row, dest, out)


@kernel
def _copy_column(src, shift, u8, meta, j, c, lo, n, r0, out):  # type: ignore[no-untyped-def]
    """Rows ``lo:lo + n`` of record batch ``c``, column ``j`` -> ``out[r0:r0 + n, j]``: the
    same cast and null rule as :func:`_column`, reading consecutive values."""
    base = (meta[c, j, 2] >> shift) + meta[c, j, 3] + lo
    for i in range(n):
        out[r0 + i, j] = src[base + i]
    v = meta[c, j, 1]
    if v >= 0:
        k0 = meta[c, j, 3] + lo
        for i in range(n):
            k = k0 + i
            if ((u8[v + (k >> 3)] >> (k & 7)) & 1) == 0:
                out[r0 + i, j] = 0


@kernel
def _copy_bool(u8, meta, j, c, lo, n, r0, out):  # type: ignore[no-untyped-def]
    for i in range(n):
        k = meta[c, j, 3] + lo + i
        v = meta[c, j, 1]
        if v < 0 or ((u8[v + (k >> 3)] >> (k & 7)) & 1) == 1:
            out[r0 + i, j] = (u8[meta[c, j, 2] + (k >> 3)] >> (k & 7)) & 1
        else:
            out[r0 + i, j] = 0


@kernel
def _uniform_code(meta, c):  # type: ignore[no-untyped-def]
    """The type code every column of record batch ``c`` has, when none has nulls and none
    is bool; else -1."""
    if meta.shape[1] == 0:
        return -1
    code = meta[c, 0, 0]
    for j in range(meta.shape[1]):
        if meta[c, j, 0] != code or meta[c, j, 1] >= 0:
            return -1
    return -1 if code == BOOL else code


@kernel
def _rows_across(src, shift, meta, c, lo, n, r0, out):  # type: ignore[no-untyped-def]
    """Rows ``lo:lo + n`` of record batch ``c`` -> ``out[r0:r0 + n, :]``, for columns all of
    one type without nulls: ``_ACROSS`` rows at a time, a column at a time, each column's
    rows ``_AHEAD`` on asked for (prefetched) as it is read.

    The ``_ACROSS`` records being written stay in L1 (64 W1 records: 25 KB) while each column
    is read in order. Not a row at a time across every column: a record batch's columns lie
    a multiple of 4 KB apart whenever its rows fill whole pages (W1: 1,024 rows a batch, 4 KB
    per float32 column), so that loop's 64 reads of a row map to one L1 set, which holds 8-12
    lines (W1's features, one shard, JIT: 118 against 43-64 ms, bench/RESULTS.md "Building
    records from the columns"). Without the prefetch: 56-58 ms."""
    k = meta.shape[1]
    base = np.empty(k, dtype=np.int64)
    for j in range(k):
        base[j] = (meta[c, j, 2] >> shift) + meta[c, j, 3] + lo
    size = src.itemsize
    addr = src.ctypes.data
    for t in range(0, n, _ACROSS):
        m = min(_ACROSS, n - t)
        ahead = t + _AHEAD
        for j in range(k):
            if ahead < n:
                at = addr + (base[j] + ahead) * size
                for q in range(0, min(_ACROSS, n - ahead) * size, 64):
                    prefetch(at + q)
            b = base[j] + t
            for i in range(m):
                out[r0 + t + i, j] = src[b + i]


_ACROSS = 64  # rows a block of _rows_across (W1 features, JIT: 43-64 ms; 32 rows: 81, 256: 55)
_AHEAD = 128  # rows ahead of the block that it prefetches


@kernel
def copy_ranges(views, meta, starts, firsts, ends, dests, block, out):  # type: ignore[no-untyped-def]
    """Runs of consecutive shard rows: rows ``firsts[i]:ends[i]`` (shard-local) ->
    ``out[dests[i]:dests[i] + ends[i] - firsts[i], :]``, the values :func:`gather_fixed`
    writes for those rows.

    Tiled: ``block`` rows at a time, all columns, so the tile of ``out`` stays in cache while
    each column is read sequentially (a row-major copy, see stoker.loader.fastpath.rowmajor and
    stoker.loader.read.staging).
    """
    last = starts.shape[0] - 1
    for i in range(firsts.shape[0]):
        pos = firsts[i]
        c = last_at_or_below(starts, pos, 0, last)
        while pos < ends[i]:
            stop = min(ends[i], starts[c + 1])
            _copy_rows(views, meta, c, pos - starts[c], stop - pos, dests[i] + pos - firsts[i],
                       block, out)
            pos = stop
            c += 1


@kernel
def _copy_rows(views, meta, c, lo, n, r0, block, out):  # type: ignore[no-untyped-def]
    """Rows ``lo:lo + n`` of record batch ``c`` -> ``out[r0:r0 + n, :]``, ``block`` rows
    at a time over every column (the tile of ``out`` stays in cache while each column is
    read sequentially); in blocks that fit L1, prefetched, when they are all of one type
    without nulls (:func:`_rows_across`: 2.3x a row at a time for W1's 64 float32 features,
    bench/RESULTS.md "Building records from the columns")."""
    u8, i8, i16, i32, i64, u16, u32, u64, f32, f64 = views
    code = _uniform_code(meta, c)
    if code == F32:
        return _rows_across(f32, 2, meta, c, lo, n, r0, out)
    if code == I64:
        return _rows_across(i64, 3, meta, c, lo, n, r0, out)
    if code == F64:
        return _rows_across(f64, 3, meta, c, lo, n, r0, out)
    if code == I32:
        return _rows_across(i32, 2, meta, c, lo, n, r0, out)
    if code == I16:
        return _rows_across(i16, 1, meta, c, lo, n, r0, out)
    if code == I8:
        return _rows_across(i8, 0, meta, c, lo, n, r0, out)
    if code == U8:
        return _rows_across(u8, 0, meta, c, lo, n, r0, out)
    if code == U16:
        return _rows_across(u16, 1, meta, c, lo, n, r0, out)
    if code == U32:
        return _rows_across(u32, 2, meta, c, lo, n, r0, out)
    if code == U64:
        return _rows_across(u64, 3, meta, c, lo, n, r0, out)
    for t in range(lo, lo + n, block):
        m = min(block, lo + n - t)
        r = r0 + t - lo
        for j in range(meta.shape[1]):
            code = meta[0, j, 0]
            if code == F32:
                _copy_column(f32, 2, u8, meta, j, c, t, m, r, out)
            elif code == I64:
                _copy_column(i64, 3, u8, meta, j, c, t, m, r, out)
            elif code == F64:
                _copy_column(f64, 3, u8, meta, j, c, t, m, r, out)
            elif code == I32:
                _copy_column(i32, 2, u8, meta, j, c, t, m, r, out)
            elif code == I16:
                _copy_column(i16, 1, u8, meta, j, c, t, m, r, out)
            elif code == I8:
                _copy_column(i8, 0, u8, meta, j, c, t, m, r, out)
            elif code == U8:
                _copy_column(u8, 0, u8, meta, j, c, t, m, r, out)
            elif code == U16:
                _copy_column(u16, 1, u8, meta, j, c, t, m, r, out)
            elif code == U32:
                _copy_column(u32, 2, u8, meta, j, c, t, m, r, out)
            elif code == U64:
                _copy_column(u64, 3, u8, meta, j, c, t, m, r, out)
            else:
                _copy_bool(u8, meta, j, c, t, m, r, out)


@kernel
def columns_to_records(addrs, sizes, offsets, rows, block, out, stride):  # type: ignore[no-untyped-def]
    """Row ``r`` of column ``j`` (``sizes[j]`` bytes per row, contiguous at address
    ``addrs[j]``) -> bytes ``offsets[j]:offsets[j] + sizes[j]`` of record ``r`` (records of
    ``stride`` bytes from address ``out``), for ``rows`` rows, ``block`` rows at a time over
    every column (the tile of records stays in cache while each column is read in order).
    4- and 8-byte values move as one word each where their offset and the stride are
    multiples of their size, else byte by byte.

    Plain columns (no nulls, no cast) made row-major in one call that holds no GIL: NumPy
    copies one column of one tile per call and takes the GIL for each
    (stoker.loader.read.indexed.row_groups.plain_records)."""
    o8 = pointer(out)
    o32 = pointer32(out)
    o64 = pointer64(out)
    for t in range(0, rows, block):
        m = min(block, rows - t)
        for j in range(addrs.shape[0]):
            size, o = sizes[j], offsets[j]
            if size == 4 and o % 4 == 0 and stride % 4 == 0:
                p32 = pointer32(addrs[j])
                s, d = stride >> 2, o >> 2
                for r in range(t, t + m):
                    o32[r * s + d] = p32[r]
            elif size == 8 and o % 8 == 0 and stride % 8 == 0:
                p64 = pointer64(addrs[j])
                s, d = stride >> 3, o >> 3
                for r in range(t, t + m):
                    o64[r * s + d] = p64[r]
            else:
                p8 = pointer(addrs[j])
                for r in range(t, t + m):
                    for b in range(size):
                        o8[r * stride + o + b] = p8[r * size + b]


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
def _list_typed(src, shift, is_bool, views, meta, chunk, row, dest, out):  # type: ignore[no-untyped-def]
    u8 = views[0]
    n_rows = chunk.shape[0]
    width = out.shape[1]
    first = np.empty(n_rows, dtype=np.int64)  # element index of each row's first value
    count = np.zeros(n_rows, dtype=np.int64)
    for i in range(n_rows):  # pass 1: offsets (independent misses, overlapped)
        m = meta[chunk[i]]
        k = m[3] + row[i]
        if _valid(u8, m[0], k):
            a, b = _bounds(views, m, k)
            first[i] = m[7] + a
            count[i] = b - a
    for i in range(n_rows):  # pass 2: values, padding
        m = meta[chunk[i]]
        d = dest[i]
        e0 = first[i]
        base = m[6] >> shift
        for t in range(count[i]):
            e = e0 + t
            if not _valid(u8, m[5], e):
                out[d, t] = 0
            elif is_bool:
                out[d, t] = (u8[m[6] + (e >> 3)] >> (e & 7)) & 1
            else:
                out[d, t] = src[base + e]
        for t in range(count[i], width):
            out[d, t] = 0


@kernel
def gather_list(views, meta, chunk, row, dest, out):  # type: ignore[no-untyped-def]
    """List values -> padded ``out[dest[i], :]`` (padding and null values -> 0).

    ``meta`` is int64 ``[chunks, 8]``: the four :func:`var_lengths` fields, then the child's
    (type code, validity byte offset or -1, data byte offset, array offset).
    """
    if chunk.shape[0] == 0:
        return
    u8, i8, i16, i32, i64, u16, u32, u64, f32, f64 = views
    code = meta[0, 4]
    if code == F32:
        _list_typed(f32, 2, False, views, meta, chunk, row, dest, out)
    elif code == F64:
        _list_typed(f64, 3, False, views, meta, chunk, row, dest, out)
    elif code == I64:
        _list_typed(i64, 3, False, views, meta, chunk, row, dest, out)
    elif code == I32:
        _list_typed(i32, 2, False, views, meta, chunk, row, dest, out)
    elif code == I16:
        _list_typed(i16, 1, False, views, meta, chunk, row, dest, out)
    elif code == I8:
        _list_typed(i8, 0, False, views, meta, chunk, row, dest, out)
    elif code == U8:
        _list_typed(u8, 0, False, views, meta, chunk, row, dest, out)
    elif code == U16:
        _list_typed(u16, 1, False, views, meta, chunk, row, dest, out)
    elif code == U32:
        _list_typed(u32, 2, False, views, meta, chunk, row, dest, out)
    elif code == U64:
        _list_typed(u64, 3, False, views, meta, chunk, row, dest, out)
    else:
        _list_typed(u8, 0, True, views, meta, chunk, row, dest, out)


@kernel
def _list_run(views, meta, c, lo, n, r0, out):  # type: ignore[no-untyped-def]
    """Rows ``lo:lo + n`` of record batch ``c`` of a list column -> padded ``out[r0:r0 + n]``
    when its values have no validity bitmap and are not bool (what :func:`gather_list`
    writes, without a per-value null test); ``False`` (nothing written) otherwise."""
    u8, i8, i16, i32, i64, u16, u32, u64, f32, f64 = views
    code = meta[c, 4]
    if meta[c, 5] >= 0:
        return False
    if code == F32:
        _list_values(f32, 2, views, meta, c, lo, n, r0, out)
    elif code == F64:
        _list_values(f64, 3, views, meta, c, lo, n, r0, out)
    elif code == I64:
        _list_values(i64, 3, views, meta, c, lo, n, r0, out)
    elif code == I32:
        _list_values(i32, 2, views, meta, c, lo, n, r0, out)
    elif code == I16:
        _list_values(i16, 1, views, meta, c, lo, n, r0, out)
    elif code == I8:
        _list_values(i8, 0, views, meta, c, lo, n, r0, out)
    elif code == U8:
        _list_values(u8, 0, views, meta, c, lo, n, r0, out)
    elif code == U16:
        _list_values(u16, 1, views, meta, c, lo, n, r0, out)
    elif code == U32:
        _list_values(u32, 2, views, meta, c, lo, n, r0, out)
    elif code == U64:
        _list_values(u64, 3, views, meta, c, lo, n, r0, out)
    else:
        return False
    return True


@kernel
def _list_values(src, shift, views, meta, c, lo, n, r0, out):  # type: ignore[no-untyped-def]
    """:func:`_list_run` for values of the typed view ``src``."""
    u8 = views[0]
    m = meta[c]
    width = out.shape[1]
    base = (m[6] >> shift) + m[7]
    for i in range(n):
        k = m[3] + lo + i
        d = r0 + i
        count = 0
        if _valid(u8, m[0], k):
            a, b = _bounds(views, m, k)
            count = b - a
            p = base + a
            for t in range(count):
                out[d, t] = src[p + t]
        for t in range(count, width):
            out[d, t] = 0


_LIST_BLOCK = 2048  # rows per gather_list call of copy_list_ranges (bounds its scratch arrays)


@kernel
def copy_list_ranges(views, meta, starts, firsts, ends, dests, out):  # type: ignore[no-untyped-def]
    """Runs of consecutive shard rows of a list column: rows ``firsts[i]:ends[i]``
    (shard-local) -> ``out[dests[i] + ...]``: a record batch's rows by :func:`_list_run`
    where it can (1.6x faster for W1's list<float32>[16]), else through :func:`gather_list`
    (same values, padding and nulls), a block of rows at a time with its index arrays built
    here: staging built three per-row arrays of 737 k rows in NumPy for every 5 M W1 round."""
    chunk = np.empty(_LIST_BLOCK, dtype=np.int64)
    row = np.empty(_LIST_BLOCK, dtype=np.int64)
    dest = np.empty(_LIST_BLOCK, dtype=np.int64)
    last = starts.shape[0] - 1
    for i in range(firsts.shape[0]):
        pos = firsts[i]
        c = last_at_or_below(starts, pos, 0, last)
        while pos < ends[i]:
            stop = min(ends[i], starts[c + 1])
            if _list_run(views, meta, c, pos - starts[c], stop - pos, dests[i] + pos - firsts[i],
                         out):
                pos = stop
                c += 1
                continue
            for lo in range(pos, stop, _LIST_BLOCK):
                n = min(_LIST_BLOCK, stop - lo)
                for t in range(n):
                    chunk[t] = c
                    row[t] = lo + t - starts[c]
                    dest[t] = dests[i] + lo + t - firsts[i]
                gather_list(views, meta, chunk[:n], row[:n], dest[:n], out)
            pos = stop
            c += 1


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
