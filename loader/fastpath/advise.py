"""Page-cache advice for staged rounds: read exactly the pages a round copies, all at once.

A staged round (:mod:`stoker.loader.read.staging`) copies a few hundred runs of ~``K`` = 1,024
consecutive rows: a few KB out of every column buffer of the record batches it touches. Through
a memory map, the first touch of a page is a synchronous fault, and the kernel's fault-around
reads ``read_ahead_kb`` (128 KB) around it: with 4 MB record batches of 64 columns a 1,024-row
run pulls in its whole record batch, ~10-20x the bytes it copies. While the shards fit the page
cache that costs nothing (later rounds find the rest there). When they do not (a dataset larger
than the node's memory) the pages are evicted before the rounds that need them run: 20 M W1
rows (7.4 GB of shards) in a 6 GiB memory cgroup read 24 k rows/s on a cold first run.

So a mapped shard is advised ``MADV_RANDOM`` once (no fault-around), and before a round copies
a shard's runs, every page those runs read is advised ``MADV_WILLNEED``: the kernel queues all
of those reads at once (a deep queue instead of one synchronous fault after another) and the
copy that follows finds them resident. Only the bytes the round copies are read, so what the
page cache must hold is bounded by the round (the staging budget), at any dataset size. Rounds
whose pages are already cached (a later epoch, a dataset that fits memory) skip the advice
after one ``mincore`` per run.

Opening a shard: pyarrow's reads of each record batch's metadata, with read-around, bring in
the whole file (``mincore``: a 249 MB shard 100 % resident after ``read_all``, 3.5 % when
advised first). Where the shards fit in memory that sequential read is the fastest way in;
where they do not (:func:`shards_fit_memory`) every shard would be read whole once per process
and evicted again, so staged shards are then advised before pyarrow opens them
(:func:`advise_random`, from :class:`~stoker.loader.read.open_shards.OpenShards`).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
from typing import TYPE_CHECKING, Sequence

import numpy as np

from stoker.loader import fallbacks
from stoker.loader.fastpath import kernels as k
from stoker.loader.fastpath.ipc_meta import message_ranges
from stoker.loader.fastpath.ring import libc_fn
from stoker.loader.fastpath.rowmajor import _physical_memory

if TYPE_CHECKING:
    from stoker.loader.fastpath.plan import ShardData
    from stoker.loader.fastpath.rowmajor import Field

__all__ = ["advise_list_offsets", "advise_open", "advise_random", "advise_runs", "advise_whole",
           "cached_pages", "memory_limit", "page_ranges", "run_byte_ranges", "shards_fit_memory",
           "smaps_entry"]

_PAGE = mmap.PAGESIZE
_NORMAL = getattr(mmap, "MADV_NORMAL", 0)
_RANDOM = getattr(mmap, "MADV_RANDOM", 1)
_WILLNEED = getattr(mmap, "MADV_WILLNEED", 3)
#: Value byte width of each physical type code (``BOOL`` is bit-packed: handled apart).
_WIDTH = np.zeros(11, dtype=np.int64)
for _code, _width in ((k.I8, 1), (k.I16, 2), (k.I32, 4), (k.I64, 8), (k.U8, 1), (k.U16, 2),
                      (k.U32, 4), (k.U64, 8), (k.F32, 4), (k.F64, 8)):
    _WIDTH[_code] = _width

def _pieces(starts: np.ndarray, first: np.ndarray,
            end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Runs of shard rows ``first[i]:end[i]`` cut at record-batch boundaries ``starts``:
    ``(chunk, lo, hi)`` with ``lo:hi`` rows of record batch ``chunk`` (its own numbering)."""
    keep = end > first
    first, end = first[keep], end[keep]
    c0 = np.searchsorted(starts, first, side="right") - 1
    c1 = np.searchsorted(starts, end - 1, side="right") - 1
    n = c1 - c0 + 1
    chunk = np.repeat(c0, n) + (np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n))
    lo = np.maximum(np.repeat(first, n), starts[chunk])
    hi = np.minimum(np.repeat(end, n), starts[chunk + 1])
    return chunk, lo - starts[chunk], hi - starts[chunk]


def _fixed(meta: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> list[np.ndarray]:
    """Byte ranges ``[lo, hi)`` in the arena of value rows ``lo:hi`` of fixed-width columns
    with kernel metadata ``meta[..., (code, valid, data, offset)]`` (``lo``/``hi`` broadcast
    against ``meta[..., 0]``): the values and, for columns with nulls, the validity bits."""
    code, valid, data, off = (meta[..., i] for i in range(4))
    a, b = off + lo, off + hi
    bits = code == k.BOOL
    w = _WIDTH[code]
    dlo = np.where(bits, data + a // 8, data + a * w)
    dhi = np.where(bits, data + (b + 7) // 8, data + b * w)
    has = valid >= 0
    return [np.stack([dlo.ravel(), dhi.ravel()]),
            np.stack([(valid + a // 8)[has], (valid + (b + 7) // 8)[has]])]


def _offsets_at(d: ShardData, meta: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Value offsets ``rows`` of list columns (``meta``: one kernel metadata row per row)."""
    big = meta[:, 2] != 0
    out = np.empty(len(rows), dtype=np.int64)
    out[big] = d.views[4][(meta[big, 1] + rows[big] * 8) // 8]
    out[~big] = d.views[3][(meta[~big, 1] + rows[~big] * 4) // 4]
    return out


def run_byte_ranges(d: ShardData, fields: Sequence[Field], first: np.ndarray,
                    end: np.ndarray, values: bool = False) -> np.ndarray:
    """The byte ranges of ``d``'s arena that copying rows ``first[i]:end[i]`` of ``fields``
    reads, as int64 ``[2, n]`` (start, end) offsets, unsorted and possibly overlapping.

    ``values=False``: fixed-width columns, and lists' validity bits and offsets; ``values=True``:
    lists' values, whose ranges are read from those offsets (advise the first part first, so
    that read does not fault page by page)."""
    return _ranges(d, fields, _pieces(d.starts, np.asarray(first, np.int64),
                                      np.asarray(end, np.int64)), values)


def _ranges(d: ShardData, fields: Sequence[Field],
            pieces: tuple[np.ndarray, np.ndarray, np.ndarray], values: bool) -> np.ndarray:
    """:func:`run_byte_ranges` of runs already cut at record batches (:func:`_pieces`)."""
    chunk, lo, hi = pieces
    out: list[np.ndarray] = []
    for f in fields:
        if f.kind != "list":
            if not values:
                out += _fixed(d.matrix_meta(f.columns)[chunk], lo[:, None], hi[:, None])
            continue
        meta = d.meta[f.name][chunk]  # [pieces, (valid, offsets, big, offset, child's 4)]
        a, b = meta[:, 3] + lo, meta[:, 3] + hi
        if values:
            out += _fixed(meta[:, 4:8], _offsets_at(d, meta, a), _offsets_at(d, meta, b))
        else:
            out += _list_heads(meta, a, b)
    ranges = np.concatenate(out, axis=1) if out else np.empty((2, 0), np.int64)
    return ranges[:, ranges[1] > ranges[0]]


def _list_heads(meta: np.ndarray, a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    """Byte ranges of list offsets and validity bits that rows ``a[i]:b[i]`` (in array
    positions) of record batch ``meta[i]`` read."""
    ow = np.where(meta[:, 2] != 0, 8, 4)
    has = meta[:, 0] >= 0
    return [np.stack([meta[:, 1] + a * ow, meta[:, 1] + (b + 1) * ow]),
            np.stack([(meta[:, 0] + a // 8)[has], (meta[:, 0] + (b + 7) // 8)[has]])]


def page_ranges(ranges: np.ndarray, size: int) -> np.ndarray:
    """Byte ranges widened to whole pages, clipped to ``size``, sorted and merged where they
    touch: int64 ``[2, m]``."""
    lo = ranges[0] // _PAGE * _PAGE
    hi = np.minimum(-(-ranges[1] // _PAGE) * _PAGE, -(-size // _PAGE) * _PAGE)
    lo, hi = lo[hi > lo], hi[hi > lo]
    if not len(lo):
        return np.empty((2, 0), dtype=np.int64)
    o = np.argsort(lo, kind="stable")
    lo, hi = lo[o], np.maximum.accumulate(hi[o])
    new = np.ones(len(lo), dtype=bool)
    new[1:] = lo[1:] > hi[:-1]
    group = np.cumsum(new) - 1
    ends = np.zeros(int(group[-1]) + 1, dtype=np.int64)
    np.maximum.at(ends, group, hi)
    return np.stack([lo[new], ends])


def advise_runs(d: ShardData, fields: Sequence[Field], first: np.ndarray,
                end: np.ndarray) -> int:
    """Advise the pages that copying rows ``first[i]:end[i]`` of ``fields`` out of the
    memory-mapped shard ``d`` will read (see the module docstring); returns the bytes advised.

    A shard that is not a file mapping (``d.mapped`` false: packed copies, decoded row groups)
    is left alone. Advice is only a hint: a platform without ``madvise``, or a kernel that
    refuses it, is the named fallback ``no_readahead`` (counted, logged once), never an error.
    """
    if not d.mapped:
        return 0
    if not d.random_advised:
        d.random_advised = advise_random(d.arena)
        if not d.random_advised:  # no madvise here (noted): the pages fault in as they are
            return 0
    arena, base = d.arena, d.arena.address
    pieces = _pieces(d.starts, np.asarray(first, np.int64), np.asarray(end, np.int64))
    if _cached(base, arena.size, d, fields, pieces):
        return 0
    fn = libc_fn("madvise", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    total = _advise_all(fn, base, _absent(base, page_ranges(
        _ranges(d, fields, pieces, values=False), arena.size)))
    if any(f.kind == "list" for f in fields):
        total += _advise_all(fn, base, _absent(base, page_ranges(
            _ranges(d, fields, pieces, values=True), arena.size)))
    return total


def advise_open(arena: object) -> int:
    """Advise the pages pyarrow reads to open the IPC file ``arena`` (its footer and every
    record batch's message), all at once, before it reads them: in a map advised
    ``MADV_RANDOM`` each of those reads is otherwise a synchronous fault of its own, one
    message after another (20 M W1 rows in 6 GiB: a first round opening 32 shards of 652
    record batches took 15.7 s). Returns the bytes advised (0 for a file it does not parse)."""
    fn = libc_fn("madvise", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    ranges = message_ranges(arena)
    if fn is None or ranges is None:
        return 0
    base, size = arena.address, arena.size  # type: ignore[attr-defined]
    return _advise_all(fn, base, page_ranges(ranges, size))


def advise_list_offsets(d: ShardData, names: Sequence[str]) -> int:
    """Advise the validity and offsets buffers of list columns ``names`` in every record batch
    of the mapped shard ``d``: a layout check reads them all when the shard opens
    (:meth:`~stoker.loader.fastpath.rowmajor.RecordLayout.misfits`). Returns the bytes advised."""
    fn = libc_fn("madvise", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    if fn is None or not d.mapped or not names:
        return 0
    rows = np.diff(d.starts)
    out = []
    for name in names:
        meta = d.meta[name][:len(rows)]  # [batches, (valid, offsets, big, offset, ...)]
        out += _list_heads(meta, meta[:, 3], meta[:, 3] + rows)
    ranges = np.concatenate(out, axis=1)
    return _advise_all(fn, d.arena.address, page_ranges(ranges[:, ranges[1] > ranges[0]],
                                                        d.arena.size))


def memory_limit() -> int | None:
    """The memory this process may use, page cache included: the smaller of the machine's
    (physical pages) and its memory cgroup's limit (v1 ``memory.limit_in_bytes``, v2
    ``memory.max``); ``None`` where neither can be read."""
    physical = _physical_memory()
    limits = [] if physical is None else [physical]
    try:
        with open("/proc/self/cgroup") as f:
            groups = [line.rstrip("\n").split(":", 2) for line in f]
    except (OSError, ValueError, IndexError):
        return min(limits, default=None)
    for _, controllers, path in groups:
        if controllers == "memory":
            candidate = f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"
        elif controllers == "":
            candidate = f"/sys/fs/cgroup{path}/memory.max"
        else:
            continue
        try:
            with open(candidate) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            limits.append(int(text))
    return min(limits, default=None)


def shards_fit_memory(shard_bytes: int, limit: int | None = None) -> bool:
    """Whether a dataset's shards fit in half the memory this process may use: then opening
    a shard with the kernel's read-around (which reads it whole, sequentially: 2.5-2.8 M W1
    rows/s on a cold first run against 1.3-1.4 M advised ``MADV_RANDOM`` at open) is the
    faster way in; beyond it (20 M rows, 7.4 GB, in a 6 GiB cgroup) the whole-file reads are
    evicted before use and shards are opened advised (1.25 -> 1.39-1.45 M rows/s)."""
    limit = memory_limit() if limit is None else limit
    return limit is None or shard_bytes <= limit // 2


def advise_random(arena: object) -> bool:
    """Advise ``MADV_RANDOM`` for the memory map ``arena`` (a ``pyarrow.Buffer`` over a whole
    file): its pages then fault in alone, without the kernel's read-around. Whether it was
    advised; a refusal is the fallback ``no_readahead``."""
    fn = libc_fn("madvise", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    base, size = arena.address, arena.size  # type: ignore[attr-defined]
    if fn is None or base % _PAGE:
        fallbacks.note("no_readahead", "madvise is not available here" if fn is None
                       else f"the shard's map starts at {base:#x}, not at a page boundary")
        return False
    return _call(fn, base, -(-size // _PAGE) * _PAGE, _RANDOM)


#: Bytes per ``MADV_WILLNEED`` call of :func:`advise_whole`. The kernel reads at most the
#: device's read-ahead window of one call's range (one call over a 240 MB shard brought in
#: 8 MB here, ``read_ahead_kb`` = 8192; the usual default is 128). Pieces of that default
#: read 0.8 GB of shards, page cache dropped, in 0.32 s here (8 MB pieces: 0.40 s).
_WHOLE_CHUNK = 128 << 10


def smaps_entry(address: int) -> dict[str, str]:
    """The kernel's account of the map of this process holding ``address``
    (``/proc/self/smaps``, Linux): its flags (``VmFlags``, e.g. ``hg`` for
    ``MADV_HUGEPAGE``) and sizes (``FilePmdMapped``: how much of it 2 MB entries map), as
    text by key; ``{}`` when no map holds it. Reads every map's entry: for checks and
    benchmarks, not per batch."""
    inside, entry = False, {}
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(maxsplit=1)[0]
            if "-" in head and not head.endswith(":"):  # "lo-hi perms offset dev inode path"
                if inside:
                    break
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside:
                key, value = line.split(":", 1)
                entry[key] = value.strip()
    return entry


def advise_whole(arena: object) -> bool:
    """Undo :func:`advise_random` for the map ``arena`` and ask for all of it ahead
    (``MADV_WILLNEED``, in ``_WHOLE_CHUNK`` pieces): a shard whose columns are all read (its
    records are built from them, or no records serve it) is then read in sequence with a
    deep queue at the disk's speed (2 M W1 rows, page cache dropped: 0.8 GB in ~0.4 s)
    instead of fault by fault as batches and builders touch it. Whether both were
    advised; a refusal is the fallback ``no_readahead``."""
    fn = libc_fn("madvise", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    base, size = arena.address, arena.size  # type: ignore[attr-defined]
    if fn is None or base % _PAGE:
        return False
    size = -(-size // _PAGE) * _PAGE
    return _call(fn, base, size, _NORMAL) and all(
        _call(fn, base + at, min(_WHOLE_CHUNK, size - at), _WILLNEED)
        for at in range(0, size, _WHOLE_CHUNK))


def _cached(base: int, size: int, d: ShardData, fields: Sequence[Field],
            pieces: tuple[np.ndarray, np.ndarray, np.ndarray]) -> bool:
    """Whether the runs' rows of one column (the first fixed-width one) are in the page cache,
    page by page (``mincore``, one call per run: a few pages each): a round over cached shards
    then skips the rest (its exact ranges cost ~2 ms per shard and round, and one ``mincore``
    over the record batches they touch ~1 ms). A round's pages are advised and read together,
    so one column stands for the others; were it wrong, the pages would fault in as without
    advice, the same bytes."""
    fixed = [f for f in fields if f.kind != "list"]
    if not fixed:
        return False
    chunk, lo, hi = pieces
    pages = page_ranges(_fixed(d.matrix_meta(fixed[0].columns[:1])[chunk], lo[:, None],
                               hi[:, None])[0], size)
    for a, b in zip(pages[0].tolist(), pages[1].tolist()):
        resident = _residency(base, a, b)
        if resident is None or not resident.all():
            return False
    return True


def cached_pages(path: str) -> np.ndarray | None:
    """Which pages of file ``path`` are in the page cache (``mincore`` of a map that touches
    none of them); ``None`` when that cannot be known. For benchmarks and tests."""
    size = os.path.getsize(path)
    if not size:
        return np.zeros(0, dtype=bool)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as m:
        view = np.frombuffer(m, dtype=np.uint8)
        base = view.ctypes.data
        del view  # no export left on the map: it can be closed
        return _residency(base, 0, -(-size // _PAGE) * _PAGE)


def _residency(base: int, lo: int, hi: int) -> np.ndarray | None:
    """Which pages of ``[lo, hi)`` (page-aligned offsets from ``base``) are in the page cache
    (``mincore``); ``None`` when that cannot be known (no ``mincore``, a range not mapped)."""
    fn = libc_fn("mincore", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    vec = np.empty((hi - lo) // _PAGE, dtype=np.uint8)
    if fn is None or fn(base + lo, hi - lo, vec.ctypes.data) != 0:
        return None
    return (vec & 1).astype(bool)


#: Page ranges further apart than this share no ``mincore`` call (:func:`_absent`).
_SPAN_GAP = 64 * _PAGE


def _absent(base: int, pages: np.ndarray) -> np.ndarray:
    """The page ranges holding a page that is not in the page cache (``mincore``, one call
    per cluster of ranges less than ``_SPAN_GAP`` apart): a round over cached shards then
    advises nothing (measured: 1.65 M ``madvise`` calls cost a cached 20 M-row epoch 4.0 ->
    2.7 M rows/s). Not one call over their whole span: the rows a stored records file is
    checked at (stoker.loader.fastpath.record_check) lie a few pages each across the whole
    shard, and asking about all of its pages cost ~7 ms per call (a 240 MB W1 shard)."""
    if not pages.shape[1]:
        return pages
    cut = np.flatnonzero(pages[0, 1:] - pages[1, :-1] > _SPAN_GAP) + 1
    keep = np.zeros(pages.shape[1], dtype=bool)
    for group in np.split(np.arange(pages.shape[1]), cut):
        part = pages[:, group]
        lo = int(part[0, 0])
        resident = _residency(base, lo, int(part[1].max()))
        if resident is None:
            return pages  # unknown: advise them all
        missing = np.concatenate([[0], np.cumsum(~resident)])
        first, last = (part - lo) // _PAGE
        keep[group] = missing[last] > missing[first]
    return pages[:, keep]


def _advise_all(fn: ctypes._CFuncPtr, base: int, pages: np.ndarray) -> int:  # type: ignore[name-defined]
    total = 0
    for lo, hi in zip(pages[0].tolist(), pages[1].tolist()):
        if not _call(fn, base + lo, hi - lo, _WILLNEED):
            break
        total += hi - lo
    return total


def _call(fn: ctypes._CFuncPtr, addr: int, length: int, advice: int) -> bool:  # type: ignore[name-defined]
    if fn(addr, length, advice) == 0:
        return True
    err = ctypes.get_errno()
    fallbacks.note("no_readahead", f"madvise({advice}) of {length} bytes failed: "
                   f"{errno.errorcode.get(err, err)} {os.strerror(err)}")
    return False
