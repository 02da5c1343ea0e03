"""Page-cache advice for staged rounds (stoker.loader.fastpath.advise): the ranges advised are exactly
the bytes a round's copy reads (checked against pyarrow's own slicing), only those pages are
read from disk, and a platform that refuses advice is a counted fallback with the same bytes."""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.loader import fallbacks
from stoker.loader.fastpath.plan import ShardData
from stoker.loader.fastpath.rowmajor import Field
from stoker.loader.fastpath import advise

PAGE = mmap.PAGESIZE
ROWS = (3000, 50_000, 2500, 40_000)  # record batches: small ones and ones many pages long


def _batch(rows: int, seed: int) -> pa.RecordBatch:
    rng = np.random.default_rng(seed)
    nulls = rng.random(rows) < 0.1
    lengths = rng.integers(0, 5, rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = pa.array(rng.random(int(offsets[-1]), dtype=np.float32),
                      mask=rng.random(int(offsets[-1])) < 0.05)
    return pa.record_batch({
        "a": pa.array(rng.random(rows, dtype=np.float32)),
        "b": pa.array(rng.integers(0, 9, rows), mask=nulls),
        "c": pa.array(rng.random(rows) < 0.5, mask=rng.random(rows) < 0.2),
        "d": pa.array(rng.integers(-5, 5, rows).astype(np.int16)),
        "l": pa.ListArray.from_arrays(pa.array(offsets), values,
                                      mask=pa.array(rng.random(rows) < 0.1)),
        "unused": pa.array(rng.random(rows)),
    })


def _write(path: Path) -> Path:
    batches = [_batch(n, i) for i, n in enumerate(ROWS)]
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, batches[0].schema) as w:
        for b in batches:
            w.write_batch(b)
    return path


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("advise") / "shard.arrow")


FIELDS = [Field("m", "matrix", 0, 2, np.dtype(np.float64), ("a", "d")),
          Field("b", "fixed", 16, 1, np.dtype(np.int64), ("b",)),
          Field("c", "fixed", 24, 1, np.dtype(np.uint8), ("c",)),
          Field("l", "list", 32, 4, np.dtype(np.float32), ("l",))]


def _open(path: Path) -> tuple[ShardData, pa.Table]:
    source = pa.memory_map(str(path), "r")
    arena = source.read_buffer(source.size())
    table = pa.ipc.open_file(arena).read_all()
    d = ShardData(table.to_batches(), arena, ["a", "b", "c", "d", "l"])
    d.mapped = True
    return d, table


def _mark(mask: np.ndarray, base: int, buf: pa.Buffer | None, lo: int, hi: int) -> None:
    if buf is not None and hi > lo:
        mask[buf.address - base + lo:buf.address - base + hi] = True


def _oracle(table: pa.Table, base: int, size: int, first: list[int],
            end: list[int]) -> np.ndarray:
    """The bytes a copy of rows ``first[i]:end[i]`` reads, from pyarrow's slices."""
    mask = np.zeros(size, dtype=bool)
    widths = {"a": 4, "b": 8, "d": 2}
    for name in ("a", "b", "c", "d", "l"):
        at = 0
        for chunk in table.column(name).chunks:
            for lo, hi in zip(first, end):
                lo_c, hi_c = max(lo - at, 0), min(hi - at, len(chunk))
                if hi_c <= lo_c:
                    continue
                sl = chunk.slice(lo_c, hi_c - lo_c)
                o, n = sl.offset, len(sl)
                valid = sl.buffers()[0] if chunk.null_count else None
                _mark(mask, base, valid, o // 8, -(-(o + n) // 8))
                if name == "c":
                    _mark(mask, base, sl.buffers()[1], o // 8, -(-(o + n) // 8))
                elif name == "l":
                    _mark(mask, base, sl.buffers()[1], o * 4, (o + n + 1) * 4)
                    child, offs = sl.values, sl.offsets.to_numpy()
                    v0, v1 = child.offset + int(offs[0]), child.offset + int(offs[-1])
                    _mark(mask, base, child.buffers()[1], v0 * 4, v1 * 4)
                    if child.null_count:
                        _mark(mask, base, child.buffers()[0], v0 // 8, -(-v1 // 8))
                else:
                    w = widths[name]
                    _mark(mask, base, sl.buffers()[1], o * w, (o + n) * w)
            at += len(chunk)
    return mask


def _runs(seed: int, total: int) -> tuple[list[int], list[int]]:
    rng = np.random.default_rng(seed)
    first = sorted(rng.choice(total - 2000, 6, replace=False).tolist())
    return first, [f + int(rng.integers(1, 1500)) for f in first]


@pytest.mark.parametrize("seed", range(6))
def test_advised_ranges_are_exactly_the_bytes_the_copy_reads(shard: Path, seed: int) -> None:
    d, table = _open(shard)
    first, end = _runs(seed, table.num_rows)
    base, size = d.arena.address, d.arena.size
    got = np.zeros(size, dtype=bool)
    for values in (False, True):
        for lo, hi in advise.run_byte_ranges(d, FIELDS, np.array(first), np.array(end),
                                             values=values).T.tolist():
            got[lo:hi] = True
    want = _oracle(table, base, size, first, end)
    assert got.sum() > 0
    np.testing.assert_array_equal(got, want)
    want[np.flatnonzero(want)[len(np.flatnonzero(want)) // 2]] = False  # the check can fail
    assert not np.array_equal(got, want)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20 * PAGE), st.integers(1, 3 * PAGE)), max_size=30),
       st.integers(1, 30 * PAGE))
def test_page_ranges_cover_exactly_the_pages_touched(spans: list[tuple[int, int]],
                                                     size: int) -> None:
    ranges = np.array([[a for a, _ in spans], [a + n for a, n in spans]],
                      dtype=np.int64).reshape(2, -1)
    pages = advise.page_ranges(ranges, size)
    npages = -(-size // PAGE)
    want = np.zeros(npages + 30, dtype=bool)
    for a, b in ranges.T.tolist():
        want[a // PAGE:-(-b // PAGE)] = True
    want[npages:] = False
    got = np.zeros_like(want)
    for a, b in pages.T.tolist():
        assert a % PAGE == 0 and b % PAGE == 0 and b > a
        got[a // PAGE:b // PAGE] = True
    np.testing.assert_array_equal(got, want)
    assert np.all(pages[0, 1:] > pages[1, :-1])  # sorted, disjoint, not touching


def _read_bytes() -> int:
    """Bytes this thread has had read from storage (``/proc/thread-self/io``): counted when
    the reads are submitted, so no wait for them is needed."""
    with open("/proc/thread-self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))


def _evict(path: Path) -> None:
    """Drop the file's clean pages from the page cache (pages nobody maps)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _resident(d: ShardData, lo: int, hi: int) -> np.ndarray:
    libc = ctypes.CDLL(None, use_errno=True)
    lo, hi = lo // PAGE * PAGE, -(-hi // PAGE) * PAGE
    vec = np.zeros((hi - lo) // PAGE, dtype=np.uint8)
    assert libc.mincore(ctypes.c_void_p(d.arena.address + lo), ctypes.c_size_t(hi - lo),
                        ctypes.c_void_p(vec.ctypes.data)) == 0
    return (vec & 1).astype(bool)


def _open_cold(path: Path) -> tuple[ShardData, pa.Table]:
    """``path`` evicted, then opened as the loader opens shards that do not fit in memory
    (advised ``MADV_RANDOM`` before pyarrow reads it), through Python's mmap: pyarrow's
    ``memory_map().read_buffer()`` advises ``WILLNEED`` on the whole file itself."""
    _evict(path)
    with open(path, "rb") as f:
        arena = pa.py_buffer(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ))
    assert advise.advise_random(arena)
    table = pa.ipc.open_file(arena).read_all()
    d = ShardData(table.to_batches(), arena, ["a", "b", "c", "d", "l"])
    d.mapped = d.random_advised = True
    return d, table


def test_only_the_advised_pages_are_read_from_disk(tmp_path: Path) -> None:
    """Evicted from the page cache, a shard's run is advised for exactly the pages of its
    bytes, and copying it brings in nothing around them (no fault-around), e.g. not the next
    rows; a page nobody advised faults in alone."""
    d, table = _open_cold(_write(tmp_path / "cold.arrow"))
    col = table.column("a").chunks[1]  # 50,000 rows: 49 pages of float32
    start = col.buffers()[1].address - d.arena.address
    assert not _resident(d, start + PAGE, start + 48 * PAGE).any(), \
        "the shard's pages were not evicted (POSIX_FADV_DONTNEED): this test needs a disk file"
    lo = int(d.starts[1]) + 10_000
    fields = [FIELDS[0]]  # columns a (float32) and d (int16)
    ranges = advise.run_byte_ranges(d, fields, np.array([lo]), np.array([lo + 1024]))
    pages = advise.page_ranges(ranges, d.arena.size)
    before = _read_bytes()
    advised = advise.advise_runs(d, fields, np.array([lo]), np.array([lo + 1024]))
    assert advised == int((pages[1] - pages[0]).sum()) > 0  # every page of the run's bytes
    assert _read_bytes() - before == advised  # read from disk by the advice, nothing more
    want = slice(start + 10_000 * 4, start + 11_024 * 4)
    before = _read_bytes()
    np.frombuffer(d.arena, dtype=np.uint8)[want].sum()  # the copy's reads of column a
    assert _read_bytes() == before  # served by the advised reads
    assert _resident(d, want.start, want.stop).all()
    assert not _resident(d, start + 20 * PAGE, start + 40 * PAGE).any()  # nothing around them
    page = (start // PAGE + 30) * PAGE
    before = _read_bytes()
    np.frombuffer(d.arena, dtype=np.uint8)[page]
    assert _read_bytes() - before == PAGE  # that page alone
    assert _resident(d, page, page + PAGE).all()
    assert not _resident(d, start + 20 * PAGE, page).any()
    assert not _resident(d, page + PAGE, start + 40 * PAGE).any()
    # a second advice of resident pages advises nothing
    assert advise.advise_runs(d, fields, np.array([lo]), np.array([lo + 1024])) == 0


def test_refused_advice_is_a_counted_fallback(shard: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d, _ = _open(shard)
    monkeypatch.setattr(advise, "libc_fn", lambda name, *types: None)
    with fallbacks.collecting() as noted:
        assert advise.advise_runs(d, FIELDS, np.array([5]), np.array([900])) == 0
    assert noted["no_readahead"][0] == 1
    assert "madvise is not available" in noted["no_readahead"][1]


def test_packed_data_is_not_advised(shard: Path) -> None:
    _, table = _open(shard)
    packed = ShardData(table.to_batches(), None, ["a", "b", "c", "d", "l"])
    with fallbacks.collecting() as noted:
        assert advise.advise_runs(packed, FIELDS, np.array([5]), np.array([900])) == 0
    assert noted == {}


def test_a_map_advised_random_before_pyarrow_reads_it_stays_mostly_on_disk(
        tmp_path: Path) -> None:
    """pyarrow's reads of every record batch's metadata, with the kernel's read-around, would
    bring in the whole file; advised first, opening a shard reads little of it."""
    d, _ = _open_cold(_write(tmp_path / "open.arrow"))
    time.sleep(0.2)  # what asynchronous read-ahead there is has arrived (a stricter check)
    assert _resident(d, 0, d.arena.size).mean() < 0.5


def test_staged_loaders_open_their_shards_advised(dataset: Path) -> None:
    from stoker.loader import DataLoader, ReadOptions, ShuffleOptions

    dl = DataLoader(str(dataset), batch_size=16, seed=1, read=ReadOptions(row_major="staged"),
                    shuffle=ShuffleOptions(partitions=4, block_size=8))
    next(iter(dl))
    opened = [d for d in dl._source._shards.data.values() if d is not None]
    assert opened and all(d.mapped and d.random_advised for d in opened)  # by the rounds
    assert not dl._source._shards.random_access  # a small dataset: opened with read-around
    plain = DataLoader(str(dataset), batch_size=16, shuffle=False)
    next(iter(plain))
    assert not any(d.random_advised for d in plain._source._shards.data.values() if d is not None)


def test_memory_limit_and_what_fits() -> None:
    limit = advise.memory_limit()
    with open("/proc/meminfo") as f:
        total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    assert limit is not None and 0 < limit <= total
    assert advise.shards_fit_memory(3 << 30, limit=6 << 30)
    assert not advise.shards_fit_memory((3 << 30) + 1, limit=6 << 30)
    assert not advise.shards_fit_memory(1 << 60)  # 1 EiB of shards: the node's limit is used


def test_message_ranges_are_each_record_batch_metadata(shard: Path) -> None:
    """One range per record batch, each exactly the message pyarrow reads there (its body
    follows it byte for byte), and the footer to the file's end."""
    from stoker.loader.fastpath.ipc_meta import message_ranges

    arena = pa.py_buffer(shard.read_bytes())
    ranges = message_ranges(arena)
    assert ranges is not None and ranges.shape == (2, len(ROWS) + 1)
    assert ranges[1, 0] == arena.size  # the footer runs to the end of the file
    reader = pa.ipc.open_file(arena)
    for i, (lo, hi) in enumerate(ranges[:, 1:].T.tolist()):
        message = pa.ipc.read_message(pa.BufferReader(arena.slice(lo)))
        assert message.type == "record batch"
        assert arena.slice(hi, message.body.size).equals(message.body)
        assert pa.ipc.read_record_batch(message, reader.schema).equals(reader.get_batch(i))
    assert message_ranges(pa.py_buffer(b"not an arrow file at all")) is None


def test_opening_advises_the_metadata_and_list_offsets_pyarrow_reads(tmp_path: Path) -> None:
    """Evicted, a shard advised random has its messages and lists' offsets advised in one go:
    after it, reading them (pyarrow's open, the layout's list check) reads nothing more
    from disk, and the column values stay on disk."""
    path = _write(tmp_path / "meta.arrow")
    _evict(path)
    with open(path, "rb") as f:
        arena = pa.py_buffer(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ))
    assert advise.advise_random(arena)
    before = _read_bytes()
    advised = advise.advise_open(arena)
    assert advised > 0 and _read_bytes() - before == advised
    table = pa.ipc.open_file(arena).read_all()
    d = ShardData(table.to_batches(), arena, ["a", "b", "c", "d", "l"])
    d.mapped = d.random_advised = True
    offsets = advise.advise_list_offsets(d, ["l"])
    assert offsets > 0
    before = _read_bytes()
    pa.ipc.open_file(arena).read_all()
    for b in table.to_batches():  # what RecordLayout.misfits reads
        np.frombuffer(b.column("l").buffers()[1], dtype=np.int32).sum()
    assert _read_bytes() == before
    col = table.column("a").chunks[1]
    start = col.buffers()[1].address - arena.address
    assert not _resident(d, start + PAGE, start + 48 * PAGE).any()
    assert advise.advise_list_offsets(d, []) == 0


def test_a_shard_opened_advised_with_a_list_of_strings_reads(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Only lists the kernels read (fixed-width values) have their offsets advised at open: a
    list<string> column, read by pyarrow, is left alone instead of failing the batch."""
    from loader_helpers import write_dataset

    import stoker.loader.read.arrow as arrow
    from stoker.loader import DataLoader, ReadOptions, ShuffleOptions

    monkeypatch.setattr(arrow, "shards_fit_memory", lambda *a, **k: False)
    tables = []
    for s in range(3):
        ids = np.arange(s * 40, s * 40 + 40)
        tables.append(pa.table({"x": (ids * 0.5).astype(np.float32),
                                "tags": pa.array([["a", str(i)] for i in ids])}))
    write_dataset(tmp_path, tables, "none", 16)
    dl = DataLoader(str(tmp_path), batch_size=8, seed=1, columns=["x", "tags"],
                    read=ReadOptions(row_major="staged"),
                    shuffle=ShuffleOptions(partitions=4, block_size=8))
    got = [(b["x"].tolist(), b["tags"]) for b in dl]
    assert all(d.random_advised for d in dl._source._shards.data.values() if d is not None)
    x = [v for xs, _ in got for v in xs]
    assert sorted(x) == sorted((np.arange(120) * 0.5).tolist())
    assert all(t == ["a", str(int(v * 2))] for xs, ts in got for v, t in zip(xs, ts))
