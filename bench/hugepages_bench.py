"""Shuffled gathers from a record file: mapped in huge pages (stoker) against 4 KB pages.

A later run reads shuffled batches from the record files a first run saved
(stoker.loader.fastpath.record_store): each of a batch's rows is a 392-byte W1 record at a
random address of a file of hundreds of MB, so with 4 KB pages nearly every row costs a TLB
miss and a page walk. :meth:`RecordStore.open` maps a file advised ``MADV_HUGEPAGE``, so its
page cache is read (or kept) in 2 MB folios mapped one entry each. This times, side by side in
one process, on one file written by :meth:`RecordStore.save` per size:

- ``stoker``: the file as ``RecordStore.open`` maps it (checksum verified, huge pages advised);
- ``4 KB``: the same file and page cache, mapped advised ``MADV_NOHUGEPAGE``: what a file
  whose page cache is in small folios gives (parts of one read back after eviction without
  the advice: the last column);

one epoch of a uniformly shuffled order, batches of 1,024 rows gathered by the loader's kernel
(``record_gather``, compiled ahead of time where the node has it, else the JIT one) into one
reused output; every batch of the first epoch is compared between the two, byte for byte.
Also reported: the share of each map the kernel holds in 2 MB entries (``FilePmdMapped`` in
``/proc/self/smaps``), and, after the file is evicted from the page cache, the share a plain
map then gets when the file was read back by an open without the advice (``MAP_POPULATE``,
the old open) or with it (``RecordStore.open``), and when it was read back by a shuffled
epoch's gathers (pages evicted during a run, under memory pressure) through a map without
the advice or with it.

    .venv/bin/python bench/hugepages_bench.py [--rows 250000 1000000 2000000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import gc
import mmap
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from stoker.loader.fastpath.advise import smaps_entry
from stoker.loader.fastpath.record_store import RecordStore
from stoker.loader.fastpath.record_table import _gather
from stoker.loader.jit import aot
from stoker.loader.jit.search import bucket_index

STRIDE = 392  # a W1 record's bytes
BATCH = 1024


def _pmd_share(arr: np.ndarray) -> float:
    """Share of the map holding ``arr`` that the kernel maps in 2 MB entries."""
    entry = smaps_entry(arr.ctypes.data)
    return int(entry.get("FilePmdMapped", "0 kB").split()[0]) / \
        max(int(entry.get("Size", "1 kB").split()[0]), 1)


def _small_map(path: str, nbytes: int, advise: int | None) -> np.ndarray:
    """``path``'s first ``nbytes`` mapped read-only and populated, advised ``advise`` first
    when given (else populated at map time: the open before huge pages)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        flags = mmap.MAP_SHARED | (0 if advise is not None else mmap.MAP_POPULATE)
        region = mmap.mmap(fd, nbytes, flags=flags, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    if advise is not None:
        region.madvise(advise)
        region.madvise(22)  # MADV_POPULATE_READ
    return np.frombuffer(region, dtype=np.uint8)


def _evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _epoch(records: np.ndarray, order: np.ndarray, out: np.ndarray,
           check: Callable[[int, np.ndarray], None] | None = None) -> float:
    """Seconds to gather every batch of ``order`` from ``records`` into ``out``."""
    gather = aot.function("record_gather") or _gather
    rows = records.shape[0]
    starts = np.array([0, rows], dtype=np.int64)
    shift, bucket = bucket_index(starts)
    addrs = np.array([records.ctypes.data], dtype=np.int64)
    offsets, sizes = np.array([0], np.int64), np.array([STRIDE], np.int64)
    out_addrs, out_strides = np.array([out.ctypes.data], np.int64), np.array([STRIDE], np.int64)
    missing, touched = np.empty(BATCH, np.int64), np.empty(BATCH, np.int64)
    marks = np.zeros(1, np.int64)
    t = time.perf_counter()
    for b, lo in enumerate(range(0, rows, BATCH)):
        ids = order[lo:lo + BATCH]
        m, _ = gather(ids, starts, shift, bucket, addrs, STRIDE, offsets, sizes, out_addrs,
                      out_strides, missing[:len(ids)], marks, b + 1, touched[:len(ids)])
        assert m == 0
        if check is not None:
            check(b, out[:len(ids)])
    return time.perf_counter() - t


def _read_back(path: str, rows: int, order: np.ndarray, out: np.ndarray,
               advised: bool) -> float:
    """Share of a plain map of ``path`` in 2 MB entries after the file was evicted and read
    back by a shuffled epoch's gathers through a map advised ``MADV_HUGEPAGE`` or not (pages
    evicted under memory pressure during a run come back so)."""
    gc.collect()  # no map of the file left: eviction drops only unmapped pages
    _evict(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        region = mmap.mmap(fd, rows * STRIDE, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    if advised:
        region.madvise(mmap.MADV_HUGEPAGE)
    _epoch(np.frombuffer(region, dtype=np.uint8).reshape(rows, STRIDE), order, out)
    return _pmd_share(_small_map(path, rows * STRIDE, None))


def run(rows: int, repeats: int, workdir: Path) -> str:
    """The table row for a record file of ``rows`` records."""
    store = RecordStore(str(workdir))
    name = RecordStore.name(f"hugepages-bench-{rows}", rows, "w1")
    nbytes = rows * STRIDE
    if not store.exists(name):
        rng = np.random.default_rng(rows)
        store.save(name, rng.integers(0, 256, size=(rows, STRIDE), dtype=np.uint8))
    path = store.path(name)
    out = np.empty((BATCH, STRIDE), np.uint8)
    order = np.random.default_rng(0).permutation(rows).astype(np.int64)
    gathered = [_read_back(path, rows, order, out, advised) for advised in (False, True)]
    gc.collect()
    _evict(path)
    opened = [_pmd_share(_small_map(path, nbytes, None))]
    gc.collect()
    _evict(path)
    mine = store.open(name, nbytes)
    assert mine is not None, "the file just saved failed its checksum"
    opened.append(_pmd_share(mine))
    mine = mine.reshape(rows, STRIDE)
    theirs = _small_map(path, nbytes + 16, mmap.MADV_NOHUGEPAGE)[:nbytes].reshape(rows, STRIDE)
    first: list[np.ndarray] = []
    _epoch(mine, order, out, lambda b, got: first.append(got.copy()))

    def same(b: int, got: np.ndarray) -> None:
        if not np.array_equal(got, first[b]):
            raise AssertionError(f"batch {b}: the 4 KB map gathered other bytes")

    _epoch(theirs, order, out, same)
    t_mine, t_theirs = [], []
    for _ in range(repeats):  # interleaved: the machine's drift hits both alike
        t_mine.append(_epoch(mine, order, out))
        t_theirs.append(_epoch(theirs, order, out))
    a, b = statistics.median(t_mine), statistics.median(t_theirs)
    return (f"| {rows:,} | {nbytes / 2**20:,.0f} | {a * 1e3:.0f} | {b * 1e3:.0f} | "
            f"{rows / a / 1e6:.2f} | {rows / b / 1e6:.2f} | {b / a:.2f}x | "
            f"{_pmd_share(mine):.0%} / {_pmd_share(theirs):.0%} | "
            f"{opened[0]:.0%} / {opened[1]:.0%} | {gathered[0]:.0%} / {gathered[1]:.0%} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[250_000, 1_000_000, 2_000_000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workdir", type=Path,
                        default=Path(tempfile.gettempdir()) / "stoker-hugepages-bench")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    lines = [run(r, args.repeats, args.workdir) for r in args.rows]
    load = os.getloadavg()
    print(f"`.venv/bin/python bench/hugepages_bench.py --rows {' '.join(map(str, args.rows))} "
          f"--repeats {args.repeats}` on {platform.machine()}, {os.cpu_count()} CPUs, Linux "
          f"{platform.release()}, Python {platform.python_version()}, load average "
          f"{load[0]:.1f}/{load[1]:.1f} at the end: one shuffled epoch of 1,024-row batches "
          f"gathered from one record file of 392-byte rows; medians of {args.repeats}, "
          "interleaved.\n")
    print("| records | MB | stoker ms | 4 KB ms | stoker M rows/s | 4 KB M rows/s | "
          "4 KB / stoker | in 2 MB entries (stoker / 4 KB) | after eviction, read back by "
          "the open: in 2 MB entries (old open / stoker's) | read back by a shuffled epoch: "
          "(plain map / advised) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|---|---|")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
