"""Stored records for staged rounds: past memory, a round reads each run of rows in one piece.

Beyond the records budget a shuffled dataset is staged (:mod:`stoker.loader.read.staging`):
each round copies a few hundred runs of ~1,024 consecutive rows out of the column-major
shards, one piece per column per run. While the shards fit the page cache that is a memory
copy; past it, every piece is a small disk read (20 M W1 rows in a 6 GiB cgroup: ~1.2 M reads
of ~5.8 KB an epoch, 0.67 M rows/s, bound by the disk's small-read rate; this disk reads 66
MB/s in 4 KB requests and 1.3 GB/s in 400 KB ones). A shard's row-major records hold a run as
one contiguous range (1,024 W1 rows: 400 KB).

So while a staged dataset is read, each shard it opens gets its records built in the
background (one shard at a time, a lower-priority thread reading the shard sequentially from
its own mapping) and saved in the node's record store under the name
:mod:`stoker.loader.fastpath.shard_records` gives them: the store's bounds apply (its size
limit, or the node cache's budget, and 10 % of the disk kept free; a refusal is the counted
``"records_not_saved"``). Rounds then copy the runs of a shard whose file exists from that
file (:class:`FileRecords`: one read per run, straight into the round's buffer), the others
from the columns: the same bytes either way.

A stored file is checked before it is served, once per process: its checksum (reading it
whole), unless a note beside it says this file (device, inode, size) already hashed right, or
was written by a process of this node in this boot (:func:`note_written`), so a later process
does not read every file twice in its first epoch past memory (a record file is written once,
to a new inode by an atomic rename, and never in place; what the note cannot see is a byte
that rots in place), then the shard's columns at its first and last rows and
a run of rows from a random offset (:func:`stoker.loader.fastpath.record_check.sample_block`:
past memory, each scattered row would cost a disk read per column); records that differ are
the counted ``"records_mismatch"``: deleted, rebuilt, and the columns serve the shard
meanwhile. Indexed Parquet's stored row-group records past memory are read and checked the
same way (stoker.loader.read.indexed.group_records).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from stoker.loader.fallbacks import note
from stoker.loader.fastpath import record_check, rowmajor
from stoker.loader.fastpath.plan import FastPlan, ShardData
from stoker.loader.fastpath.record_store import RecordStore
from stoker.loader.fastpath.rowmajor import RecordLayout
from stoker.loader.fastpath.shard_records import lower_priority
from stoker.loader.jit import executors, fork_gate
from stoker.loader.read.staging import StagedRecords
from stoker.manifest import Manifest, ShardIntegrityError

__all__ = ["FileRecords", "StagedFiles", "hashed_before", "note_hashed", "note_written",
           "write_note"]

logger = logging.getLogger(__name__)

_NOTE = ".ok"  # beside a record file: the device, inode and size it had when it hashed right
_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def hashed_before(path: str) -> bool:
    """Whether record file ``path`` hashed right before, or was written by this node in
    this boot (:func:`note_written`), and is the same file (device, inode, size) now: a
    record file is written once, to a new inode by an atomic rename."""
    try:
        st = os.stat(path)
        with open(f"{path}{_NOTE}", encoding="ascii") as f:
            line = f.read()
    except (OSError, UnicodeDecodeError):
        return False
    return line == _line(st) or (_boot() is not None and line == f"{_line(st)} {_boot()}")


def note_hashed(path: str) -> None:
    """Note that record file ``path`` hashed right (atomically); failing to costs a later
    process one hash."""
    _note(path, "")


def note_written(path: str) -> None:
    """Note that this process just wrote record file ``path`` with the digest of the bytes
    it wrote: until the machine restarts the page cache serves what was written, so a later
    process in this boot need not read the file whole to hash it (20 M W1 rows in a 6 GiB
    cgroup: the node's second run hashed 7.3 GB it then read again). A crash before the
    pages reach the disk ends the boot, and with it the note (it names the boot); after a
    restart the file is hashed once as before. Only where the kernel names its boots."""
    boot = _boot()
    if boot is not None:
        _note(path, f" {boot}")


def write_note(note: str, text: str) -> None:
    """Write ``text`` as file ``note`` atomically, through a temporary file of this thread
    (one per process: two threads noting one file renamed each other's away).

    Raises:
        OSError: the directory is not writable."""
    tmp = f"{note}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(text)
    os.replace(tmp, note)


def _note(path: str, suffix: str) -> None:
    try:
        write_note(f"{path}{_NOTE}", _line(os.stat(path)) + suffix)
    except OSError as exc:
        logger.warning("a checked record file will be hashed again: cannot note %s (%s)",
                       path, exc)


def _line(st: os.stat_result) -> str:
    return f"{st.st_dev} {st.st_ino} {st.st_size}"


@functools.lru_cache(maxsize=1)
def _boot() -> str | None:
    """This boot's id (Linux), or ``None``."""
    try:
        with open(_BOOT_ID, encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


class StagedFiles:
    """The stored records a staged source's rounds copy from (see the module docstring).

    Args:
        store: the node's record store.
        manifest: the dataset (shard hashes name the files).
        plan: the source's fast plan (the kernels' columns).
        layout: ``layout()`` -> the stager's record layout once a shard fixed it, else ``None``.
        shard_path: ``shard_path(index)`` -> the local file of shard ``index``.
    """

    def __init__(self, store: RecordStore, manifest: Manifest, plan: FastPlan,
                 layout: Callable[[], RecordLayout | None],
                 shard_path: Callable[[int], str]) -> None:
        self._store, self._manifest, self._plan = store, manifest, plan
        self._layout, self._shard_path = layout, shard_path
        self._checked: set[int] = set()  # shards whose file this process checked
        self._queued: set[int] = set()  # shards built, or being built, by this process
        self._lock = threading.Lock()
        self._pool: tuple[int, ThreadPoolExecutor] | None = None
        self._owner = os.getpid()  # builds here only: forked workers would build it again
        self.runs_from_files = 0  # shards' runs of a round copied from files (statistics)
        self.built = 0  # record files this process wrote

    def runs_of(self, shard: int, first: np.ndarray, end: np.ndarray, dest: np.ndarray,
                data_of: Callable[[int], ShardData]) -> list[tuple[Any, ...]]:
        """:class:`~stoker.loader.read.staging.Stager`'s ``runs_of``: from shard ``shard``'s
        stored records when they are there and checked, else from its columns (``data_of``)
        while its records are built."""
        layout = self._layout()
        if layout is not None:
            records = self._records(shard, layout, data_of)
            if records is not None:
                self.runs_from_files += 1
                return [(records, first, end, dest)]
            self._build_later(shard, layout)
        return [(data_of(shard), first, end, dest)]

    def _name(self, shard: int, layout: RecordLayout) -> str:
        return self._store.name(self._manifest.shards[shard].xxh3_128,
                                int(self._manifest.shard_rows[shard]), layout.key([]))

    def _records(self, shard: int, layout: RecordLayout,
                 data_of: Callable[[int], ShardData]) -> FileRecords | None:
        """Shard ``shard``'s checked file, opened for one round (``None``: none, or gone)."""
        name = self._name(shard, layout)
        path = self._store.path(name)
        if shard not in self._checked:
            if not self._check(shard, name, layout, data_of):
                return None
            self._checked.add(shard)
        try:
            return FileRecords(os.open(path, os.O_RDONLY), layout.stride)
        except FileNotFoundError:  # evicted for room since: built again
            self._checked.discard(shard)
            with self._lock:
                self._queued.discard(shard)
            return None

    def _check(self, shard: int, name: str, layout: RecordLayout,
               data_of: Callable[[int], ShardData]) -> bool:
        """Whether file ``name`` holds shard ``shard``'s records (see the module docstring)."""
        path = self._store.path(name)
        if not os.path.exists(path):
            return False
        rows = int(self._manifest.shard_rows[shard])
        if not hashed_before(path):
            if self._store.open(name, rows * layout.stride) is None:  # hashed whole
                return False
            note_hashed(path)
        try:
            os.utime(path)  # recency for the store's size bound
            with FileRecords(os.open(path, os.O_RDONLY), layout.stride) as records:
                bad = record_check.first_mismatch(layout, data_of(shard), records,
                                                  rows=record_check.sample_block(rows))
        except FileNotFoundError:
            return False
        if bad is None:
            return True
        note("records_mismatch", f"shard {shard}: stored records {name} in {self._store.root} "
                                 f"differ from the shard at row {bad.row} (output {bad.field!r})")
        self._store.discard(name)
        with self._lock:
            self._queued.discard(shard)
        return False

    # -- building ----------------------------------------------------------------------------
    def _build_later(self, shard: int, layout: RecordLayout) -> None:
        with self._lock:
            if shard in self._queued or os.getpid() != self._owner:
                return
            self._queued.add(shard)
            if self._pool is None:
                self._pool = (os.getpid(),
                              ThreadPoolExecutor(1, thread_name_prefix="stoker-staged-records"))
            pool = self._pool[1]
        pool.submit(self._build, shard, layout)

    def _build(self, shard: int, layout: RecordLayout) -> None:
        lower_priority()
        name = self._name(shard, layout)
        try:
            with fork_gate.unit():  # maps a shard and writes a file: not split by a fork
                if self._store.exists(name):
                    return
                source = pa.memory_map(self._shard_path(shard), "r")
                arena = source.read_buffer(source.size())
                batches = pa.ipc.open_file(arena).read_all().to_batches()
                if [b.num_rows for b in batches if b.num_rows] != \
                        [r for r in self._manifest.shards[shard].batch_rows if r]:
                    return  # a shard that disagrees with its manifest: its open names it
                if layout.misfits(batches):
                    return  # a list of another width here: these records would lack it
                records = rowmajor.build(layout, ShardData(batches, arena,
                                                           self._plan.kernel_columns))
                if self._store.save(name, records):
                    note_written(self._store.path(name))
                    self.built += 1
        except (OSError, pa.ArrowException) as exc:  # the columns keep serving this shard
            logger.warning("records of shard %d were not built for staging in %s: %s", shard,
                           self._store.root, exc)

    def wait(self) -> None:
        """Block until every build started so far is done (tests, benchmarks)."""
        pool = self._pool
        if pool is not None and pool[0] == os.getpid():
            pool[1].submit(lambda: None).result()

    def close(self) -> None:
        """Stop building (a build under way finishes: a file is published whole or not)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None and pool[0] == os.getpid():
            executors.stop(pool[1])


class FileRecords(StagedRecords):
    """Stored records read from their file (an open descriptor, closed with the object or on
    ``with`` exit): each run one ``preadv`` straight into the round's buffer. Read, not
    mapped: pages of a mapping stay charged to the process until reclaimed, and past memory
    they crowded the next rounds' reads out (20 M W1 rows in 6 GiB: 11 GB read for 7.8 GB
    of records an epoch). Reads give explicit offsets: threads may share one."""

    def __init__(self, fd: int, stride: int) -> None:
        self.fd, self.stride = fd, stride
        self._close = weakref.finalize(self, os.close, fd)
        if hasattr(os, "posix_fadvise"):  # exactly the runs: no read-ahead past them
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)

    def __enter__(self) -> "FileRecords":
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()

    def _read(self, out: np.ndarray, row: int) -> None:
        view = memoryview(out).cast("B")
        if os.preadv(self.fd, [view], row * self.stride) != view.nbytes:
            raise ShardIntegrityError(f"stored records ended before row {row + len(out)} "
                                      "(the file changed while it was read)")

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (sorted), one read per consecutive run of them (record_check)."""
        out = np.empty((len(rows), self.stride), dtype=np.uint8)
        cuts = np.flatnonzero(np.diff(rows) != 1) + 1
        for lo, hi in zip(np.concatenate([[0], cuts]).tolist(),
                          np.concatenate([cuts, [len(rows)]]).tolist()):
            self._read(out[lo:hi], int(rows[lo]))
        return out

    def copy_runs(self, rec: np.ndarray, first: np.ndarray, end: np.ndarray,
                  dest: np.ndarray, advised: bool = False) -> None:
        """Every run asked of the kernel at once (``POSIX_FADV_WILLNEED``: a deep queue of
        reads), then each read into the round: one synchronous read waited for after another
        left the disk idle between them (20 M W1 rows in a 6 GiB cgroup, later runs: 1.53-1.56
        M rows/s without the advice, 2.05-2.12 M with it, alternating, the page cache dropped
        before each)."""
        if not advised:
            self.advise(first, end)
        for lo, hi, to in zip(first.tolist(), end.tolist(), dest.tolist()):
            self._read(rec[to:to + hi - lo], lo)

    def advise(self, first: np.ndarray, end: np.ndarray) -> bool:
        """``POSIX_FADV_WILLNEED`` for rows ``first[i]:end[i]``: the kernel starts reading
        them now (a staged round asks for every file's runs before it reads any)."""
        if not hasattr(os, "posix_fadvise"):
            return False
        for lo, hi in zip(first.tolist(), end.tolist()):
            os.posix_fadvise(self.fd, lo * self.stride, (hi - lo) * self.stride,
                             os.POSIX_FADV_WILLNEED)
        return True
