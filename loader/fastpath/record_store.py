"""Row-major records kept on local disk, built once per node and shared by every process.

Building a shard's records (:mod:`stoker.loader.fastpath.rowmajor`) costs a pass over the shard and as
much memory as the records; a training run restarted, a second run on the same data, N worker
processes or N ranks on one node would each pay it again and each hold a private copy. So
records are built straight into a file-backed shared mapping under a node-local directory and
mapped by everyone who needs them afterwards: the memory is page cache, shared and reclaimable,
and a fresh process reads shuffled batches at the steady-state rate from its first epoch.

A file is named after everything its bytes depend on (the shard's content hash and rows, the
record layout, the fields left out, the format version), so a changed shard or layout can never
be served stale records. Its last 16 bytes are the xxh3-128 of the rest, checked every time it
is mapped (~10 ms per 250 MB): a torn write (crash, full disk) or a flipped bit is rebuilt,
never served. That checksum proves the file is the one written, not that what was written is
right (a buggy build, or whoever rewrites bytes and checksum together, passes it), so the
loader also compares a file it maps with the shard's own columns before serving it
(:mod:`stoker.loader.fastpath.record_check`, called by
:mod:`stoker.loader.fastpath.shard_records`). The process that builds records in memory writes
them afterwards, in the background, under a ``flock`` (one writer per file and node), to a
temporary file published by an atomic rename; past the page cache (``O_DIRECT``), with a
low-priority helper process reading the file into the cache afterwards
(:meth:`RecordStore.save`). (Building straight into a file-backed mapping
was measured 1.7-3x slower than anonymous memory here, bench/RESULTS.md.) Only a process whose
worker processes wait for the file builds it in place (:meth:`RecordStore.build`): they map
it once built, not once built and then written (2 M W1 rows, 2 process workers, first run:
0.49 -> 0.67 M rows/s shuffled; with no workers 1.20-1.41 M building in memory against
0.82-0.97 M in place, so a process alone keeps building in memory). The directory is
bounded, and no file is written that would leave the filesystem less than 10 % free:

* in the node cache's records directory (``<cache_dir>/row-major``, the default) of a cache
  with a byte limit, record files count against that one limit together with the shards
  (:mod:`stoker.cache.store.derived`): a save first finds room under the cache's budget lock,
  deleting the least recently mapped record files, never a shard; when the shards leave no
  room the file is not written: a counted, logged-once ``"records_not_saved"`` fallback (the
  records stay in the building process's memory). Admitting a shard deletes record files
  first in turn.
* otherwise (no cache limit, or records kept elsewhere) the directory keeps at most ``limit``
  bytes (default 32 GiB): the least recently mapped files are deleted to make room.

A process that maps a deleted file keeps reading it (the inode lives until it is unmapped).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import mmap
import os
import struct
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import xxhash

from stoker.cache.lock import FileLock
from stoker.cache.store.derived import RECORD_SUFFIX, DerivedBudget, DerivedFiles
from stoker.loader.fallbacks import note
from stoker.loader.fastpath.ring import libc_fn
from stoker.manifest import locations

__all__ = ["DEFAULT_LIMIT_BYTES", "ENV_DIR", "MIN_FREE_FRACTION", "RecordStore", "TileClaims",
           "default_dir"]

ENV_DIR = locations.ENV_RECORDS_DIR
#: Bytes of record files a directory keeps by default (least recently used go first).
DEFAULT_LIMIT_BYTES = 32 << 30
#: A record file is not written if the filesystem would then have less than this share free.
MIN_FREE_FRACTION = 0.1
_FORMAT = "stoker-records/1"
_TRAILER = 16  # xxh3-128 digest of the records
_SUFFIX = RECORD_SUFFIX
_WRITE_CHUNK = 64 << 20
_O_DIRECT = getattr(os, "O_DIRECT", None)  # Linux, FreeBSD; not macOS
_BLOCK = 4096  # O_DIRECT alignment: the disk's logical block divides it
_CLAIMS = ".tiles"  # beside a file built in place: its temporary's name, then tile states
_CLAIMS_HEADER = 4096
_DONE = 1
_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)  # Linux only
_POPULATE_READ = 22  # MADV_POPULATE_READ (Linux 5.14)
_refused: set[str] = set()  # fallbacks of advices the kernel refused once: asked no more


def default_dir(cache_dir: str | None = None) -> str | None:
    """Where records go: ``$STOKER_ROW_MAJOR_DIR`` (empty: nowhere, keep them in memory), else
    ``<cache_dir>/row-major``, where ``cache_dir`` defaults to the node cache directory
    (``$STOKER_CACHE_DIR``, else the platform cache); see
    :func:`stoker.manifest.locations.records_dir`."""
    return locations.records_dir(cache=cache_dir)


class RecordStore:
    """Record files in ``root`` (created on first use), at most ``limit`` bytes in all, or,
    with ``budget``, within the node cache's limit together with its shards.

    Raises:
        OSError: ``root`` cannot be created or written.
    """

    def __init__(self, root: str, limit: int = DEFAULT_LIMIT_BYTES,
                 min_free: float = MIN_FREE_FRACTION,
                 budget: DerivedBudget | None = None) -> None:
        os.makedirs(root, exist_ok=True)
        tempfile.TemporaryFile(dir=root).close()  # writable, or OSError now
        self.root = root
        self.limit = limit
        self.min_free = min_free
        self.budget = budget
        self._files = DerivedFiles(root)

    def _room_on_disk(self, name: str, nbytes: int) -> bool:
        """Whether writing ``nbytes`` leaves ``min_free`` of the filesystem free: records are
        an optimisation and must never take the space a cache or a checkpoint needs. A refusal
        is the counted ``"records_not_saved"`` fallback (every later process would otherwise
        build the records again without a word)."""
        try:
            st = os.statvfs(self.root)
        except (OSError, AttributeError):
            return True
        free = st.f_bavail * st.f_frsize
        if free - nbytes >= self.min_free * st.f_blocks * st.f_frsize:
            return True
        note("records_not_saved", f"{name} ({nbytes} bytes) in {self.root}: the disk would "
                                  f"keep less than {self.min_free:.0%} free ({free} bytes free "
                                  f"of {st.f_blocks * st.f_frsize})")
        return False

    @staticmethod
    def name(shard_hash: str, rows: int, layout_key: str) -> str:
        """The file name for one shard's records (see the module docstring)."""
        key = "\0".join((_FORMAT, shard_hash, str(rows), layout_key))
        return xxhash.xxh3_128_hexdigest(key.encode()) + _SUFFIX

    def _path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def open(self, name: str, nbytes: int) -> np.ndarray | None:
        """The verified records in file ``name`` (read-only, ``nbytes`` long), or ``None`` when
        there is no such file or it fails verification (then it is deleted)."""
        path = self._path(name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            if os.fstat(fd).st_size != nbytes + _TRAILER:
                region = None
            else:
                region = _map_records(fd, nbytes + _TRAILER, name)
        finally:
            os.close(fd)
        data = np.frombuffer(region, dtype=np.uint8) if region is not None else None
        if data is None or xxhash.xxh3_128_digest(data[:nbytes]) != data[nbytes:].tobytes():
            Path(path).unlink(missing_ok=True)  # torn or corrupt: rebuilt by the caller, never served
            return None
        try:
            os.utime(path)  # recency for the size bound
        except OSError:
            pass
        return data[:nbytes]

    def path(self, name: str) -> str:
        """Where file ``name`` is (or would be)."""
        return self._path(name)

    def exists(self, name: str) -> bool:
        return os.path.exists(self._path(name))

    def written(self, name: str, timeout: float) -> bool:
        """Wait until no process writes file ``name`` (holds ``<name>.lock``: :meth:`build`,
        :meth:`save`), at most ``timeout`` seconds; whether none does by then."""
        lock = FileLock(self._path(name) + ".lock")
        if not lock.acquire(shared=True, timeout=timeout):
            return False
        lock.release()
        return True

    def discard(self, name: str) -> None:
        """Delete file ``name`` (records that differ from their shard: see
        :mod:`stoker.loader.fastpath.record_check`); a process that maps it keeps its mapping.
        Should another process publish correct records under ``name`` just before, they are
        deleted too and rebuilt once more: a cost, never a wrong value."""
        Path(self._path(name)).unlink(missing_ok=True)

    def save(self, name: str, records: np.ndarray, direct: bool = False) -> bool:
        """Write ``records`` (C-contiguous) as file ``name`` unless it exists, another process
        is writing it now, the disk would keep less than ``min_free`` free, or (with a
        ``budget``) the cache's limit has no room for it beside the shards (the counted
        ``"records_not_saved"`` fallback); whether this call wrote it.

        With ``direct``, the bytes go to the disk past the page cache (``O_DIRECT``), then a
        low-priority helper process reads the published file into the page cache
        (:func:`_warm`; this call waits for it, sleeping).
        Written through the cache, every record is copied into a page-cache page while the
        epoch that built it runs, a page the guest may not have touched for seconds: on the
        VM of bench/RESULTS.md ("Writing records past the page cache") 0.07-0.58 s of CPU per
        235 MiB file against 0.02 s direct (and 0.013 s for the helper), which made a first
        natural-order run 25-33 % slower than one that saved nothing. A
        filesystem that refuses ``O_DIRECT`` (some FUSE and network filesystems) is written
        through the cache: the counted ``"records_buffered"`` fallback.

        Raises:
            OSError: no room on the disk, or the directory is not writable.
        """
        contiguous = np.ascontiguousarray(records).reshape(-1)
        raw = memoryview(contiguous).cast("B")
        wrote = False  # stays so if the file is deleted while written (said by _publishing)
        with self._publishing(name, raw.nbytes + _TRAILER) as tmp:
            if tmp is None:
                return False
            went_direct = _write(tmp, raw, contiguous.ctypes.data,
                                 xxhash.xxh3_128_digest(raw), direct)
            os.replace(tmp, self._path(name))
            wrote = True
        if wrote and went_direct:
            _warm(self._path(name))
        return wrote

    def build(self, name: str, nbytes: int,
              fill: Callable[[np.ndarray, TileClaims | None], object],
              tiles: int = 0) -> np.ndarray | None:
        """Write file ``name`` in place: ``fill(out, claims)`` writes the ``nbytes`` records
        into a shared map of a new file (its disk blocks reserved first), which is then
        published with its digest, as :meth:`save` publishes. Returns the filled records (that
        map, read-only; valid even if the file was deleted meanwhile to make room for a shard:
        then not published, the counted ``"records_not_saved"``), or ``None`` when :meth:`save`
        would not write (the file exists, another process writes it, no room): the caller
        builds in memory then. For worker processes that wait for the file: a build in memory
        then a save writes every page twice, each a fresh page on this machine
        (bench/RESULTS.md "Fresh memory"). With ``tiles``, other processes may build the
        records' tiles too (:meth:`join`): ``claims`` says which are whose (else ``None``)."""
        data = None
        with self._publishing(name, nbytes + _TRAILER) as tmp:
            if tmp is None:
                return None
            try:
                fd = os.open(tmp, os.O_RDWR)
                try:  # blocks reserved: a full disk is an OSError here, never a SIGBUS later
                    os.posix_fallocate(fd, 0, nbytes + _TRAILER)
                    region = mmap.mmap(fd, nbytes + _TRAILER, flags=mmap.MAP_SHARED)
                finally:
                    os.close(fd)
                claims = TileClaims.create(self._path(name) + _CLAIMS, tmp, tiles) \
                    if tiles else None
            except OSError as exc:
                Path(tmp).unlink(missing_ok=True)
                note("records_not_saved", f"{name} ({nbytes} bytes) in {self.root}: {exc}")
                return None
            try:
                data = np.frombuffer(region, dtype=np.uint8)
                fill(data[:nbytes], claims)
                data[nbytes:] = np.frombuffer(xxhash.xxh3_128_digest(data[:nbytes]), np.uint8)
                os.replace(tmp, self._path(name))
            finally:
                if claims is not None:
                    claims.withdraw()
        if data is None:
            return None
        records = data[:nbytes]
        records.flags.writeable = False  # shared with every process that maps the file
        return records

    def join(self, name: str, nbytes: int, tiles: int) -> tuple[np.ndarray, TileClaims] | None:
        """The writable map of file ``name`` while another process builds it in place with
        ``tiles`` tiles (:meth:`build`), and the claims that let this process build some of
        them; ``None`` when no such build is under way (not started, or published since:
        :meth:`open` then maps the file). What a tile holds once its claim says done is the
        bytes its builder wrote (each tile's builder writes the shard's records, whoever it
        is)."""
        claims = TileClaims.join(self._path(name) + _CLAIMS, self.root, tiles)
        if claims is None:
            return None
        try:
            fd = os.open(claims.target, os.O_RDWR)
        except FileNotFoundError:  # published (renamed) since the claims were read
            claims.close()
            return None
        try:
            if os.fstat(fd).st_size != nbytes + _TRAILER:
                claims.close()
                return None
            region = mmap.mmap(fd, nbytes + _TRAILER, flags=mmap.MAP_SHARED)
        finally:
            os.close(fd)
        return np.frombuffer(region, dtype=np.uint8)[:nbytes], claims

    @contextlib.contextmanager
    def _publishing(self, name: str, nbytes: int) -> Iterator[str | None]:
        """The temporary file to write ``name``'s ``nbytes`` into and publish, or ``None``
        when this process must not write it (the file exists, another process holds
        ``<name>.lock``, no room: :meth:`_reserve`). A temporary deleted while written (a
        shard needed the room) ends the block early as the counted ``"records_not_saved"``;
        any other error deletes it and propagates."""
        lock = FileLock(self._path(name) + ".lock")
        if not lock.acquire(timeout=0):
            yield None
            return
        try:
            tmp = None if self.exists(name) else self._reserve(name, nbytes)
            if tmp is None:
                yield None
                return
            try:
                yield tmp
            except FileNotFoundError:
                Path(tmp).unlink(missing_ok=True)
                note("records_not_saved", f"{name} ({nbytes} bytes) in {self.root}: deleted "
                                          "while being written, to make room for a shard")
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        finally:
            lock.release()

    def _reserve(self, name: str, nbytes: int) -> str | None:
        """The temp file to write ``name`` into, created once there is room for ``nbytes``
        (``<name>.lock`` held), or ``None``. Room: under the cache's budget when there is one
        (its lock, its limit), else under ``limit``, deleting least recently used files and
        the temp files killed writers left behind (:mod:`stoker.cache.store.derived`); and
        ``min_free`` of the disk left free either way."""
        if self.budget is not None:
            if not self._room_on_disk(name, nbytes):
                return None
            tmp = self.budget.reserve(name, nbytes)
            if tmp is None:
                note("records_not_saved", f"{name} ({nbytes} bytes) in {self.root}: no room "
                                          f"beside the shards under cache limit "
                                          f"{self.budget.limit} bytes")
            return tmp
        records, writing = self._files.scan()
        used = sum(size for _, size, _ in records + writing)
        self._files.evict(used, nbytes, self.limit, records, keep=name)
        if not self._room_on_disk(name, nbytes):
            return None
        return self._files.temp(name, nbytes)


def _still_linked(fd: int, path: str) -> None:
    """Raise ``FileNotFoundError`` if the temporary ``path`` being written was deleted (a
    shard needed the room: :mod:`stoker.cache.store.derived`)."""
    if os.fstat(fd).st_nlink == 0:
        raise FileNotFoundError(path)


def _write(path: str, raw: memoryview, address: int, digest: bytes, direct: bool) -> bool:
    """Write ``raw`` (at memory ``address``), then ``digest``, into the temporary ``path`` in
    ``_WRITE_CHUNK`` pieces, each after checking that the file was not deleted meanwhile
    (:func:`_still_linked`); whether it went past the page cache.

    With ``direct``: ``O_DIRECT``, whose reads of memory, lengths and offsets must be
    multiples of the disk's block (``_BLOCK`` covers 512 and 4096): whole blocks straight
    from ``raw`` when it is so aligned (records built in fresh pages are), else through an
    aligned bounce buffer; the last part block and the digest through the page cache
    (padded to a block, the file would outgrow the room reserved for it). A platform or a
    filesystem that refuses ``O_DIRECT`` (at the flag or at the first write) gets the rest
    through the page cache: the counted ``"records_buffered"``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        direct = direct and _try_direct(fd, path)
        body = raw.nbytes - raw.nbytes % _BLOCK if direct else raw.nbytes
        bounce = mmap.mmap(-1, min(body, _WRITE_CHUNK)) \
            if direct and body and address % _BLOCK else None
        for lo in range(0, body, _WRITE_CHUNK):
            _still_linked(fd, path)
            piece = raw[lo:min(body, lo + _WRITE_CHUNK)]
            if bounce is not None:
                bounce[:len(piece)] = piece
                piece = memoryview(bounce)[:len(piece)]
            try:
                _write_all(fd, piece)
            except OSError as exc:  # a block size past _BLOCK: refused at the first write
                if not direct or exc.errno != errno.EINVAL or lo:
                    raise
                _set_direct(fd, False)
                direct = False
                note("records_buffered", f"{path}: the filesystem refused an O_DIRECT write "
                                         f"of {len(piece)} bytes: {exc}")
                _write_all(fd, piece)
        if direct:  # the part block and the digest: never past the file's size
            _set_direct(fd, False)
        _write_all(fd, raw[body:])
        _write_all(fd, memoryview(digest))
        return direct
    finally:
        os.close(fd)


def _try_direct(fd: int, path: str) -> bool:
    """Set ``O_DIRECT`` on ``fd``; whether it could: a platform without it or a filesystem
    that refuses it is the counted ``"records_buffered"`` naming ``path``."""
    if _O_DIRECT is None:
        note("records_buffered", f"{path}: no O_DIRECT on {sys.platform}")
        return False
    try:
        _set_direct(fd, True)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        note("records_buffered", f"{path}: the filesystem refused O_DIRECT: {exc}")
        return False
    return True


def _set_direct(fd: int, on: bool) -> None:
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags | _O_DIRECT if on else flags & ~_O_DIRECT)


def _write_all(fd: int, data: memoryview) -> None:
    while data.nbytes:
        data = data[os.write(fd, data):]


# the program _warm runs in its helper process
_HELPER = """
import mmap, os, sys
os.nice(19)
path = sys.argv[1]
try:
    fd = os.open(path, os.O_RDONLY)
except FileNotFoundError:
    sys.exit(0)  # deleted since (room for a shard): nothing to read in
try:
    size = os.fstat(fd).st_size
    region = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        region.madvise(mmap.MADV_HUGEPAGE)
    try:
        region.madvise(22)  # MADV_POPULATE_READ
    except OSError:
        os.posix_fadvise(fd, 0, size, os.POSIX_FADV_WILLNEED)
finally:
    os.close(fd)
"""


def _warm(path: str) -> bool:
    """Read file ``path`` into the page cache in a helper process at the lowest CPU priority
    (nice 19), and wait for it (the caller's thread sleeps meanwhile, the GIL released);
    whether it did.

    Read back from the disk, the pages are filled by the disk's DMA: 0.013 s of CPU per
    235 MiB file here, against 0.07-0.58 s for ``write()`` to copy the records into them
    (bench/RESULTS.md "Writing records past the page cache"). The helper maps the file as
    :func:`_map_records` will (advised ``MADV_HUGEPAGE`` first, so the cache holds it in
    2 MB folios, then populated whole; ``POSIX_FADV_WILLNEED`` on kernels before 5.14). A
    process, not a thread: CPython's ``mmap.madvise`` holds the GIL for the whole read
    (0.12-0.18 s for a 246 MB file not cached here, every other thread stopped), and a
    thread at low priority that holds the GIL stalls the loader's threads (the saver in
    ``SCHED_IDLE`` made shuffled first runs 25 % slower). Nice 19, not ``SCHED_IDLE``: a
    loader that keeps both cores busy would leave an idle-class helper no CPU at all, and
    the saver's next file waits for this one. It runs ``python -I -S``: no site, no stoker,
    ~12 ms to start. A helper that cannot start or fails is the counted fallback
    ``"records_not_warmed"``: the next process that maps the file reads it from the disk,
    the same bytes."""
    try:
        done = subprocess.run([sys.executable, "-I", "-S", "-c", _HELPER, path],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, check=False)
    except OSError as exc:
        note("records_not_warmed", f"{path}: no helper process: {exc}")
        return False
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:]
        note("records_not_warmed", f"{path}: the helper exited {done.returncode}: "
                                   f"{tail[0] if tail else 'no message'}")
        return False
    return True


def _map_records(fd: int, nbytes: int, name: str) -> mmap.mmap:
    """A shared read-only map of record file ``name``, advised ``MADV_HUGEPAGE`` before any
    page is touched, then faulted in whole (``MADV_POPULATE_READ``, Linux 5.14: as
    ``MAP_POPULATE`` would, but after the advice; the checksum reads every page next).

    A shuffled batch reads each record at a random address of a file of hundreds of MB: with
    4 KB pages nearly every record costs a TLB miss and a page walk. The page cache holds a
    file in folios of up to 2 MB (Linux 6 filesystems with large folios: ext4, xfs) and maps
    a whole 2 MB folio with one entry (the kernel aligns large file maps to 2 MB); a file
    written in large pieces (:meth:`RecordStore.save`) is held so already, but one read back
    after eviction comes partly in small folios unless its map is advised first, when faults
    read 2 MB folios. A shuffled epoch's gather from 2 MB entries against 4 KB ones:
    1.1x at 37 MB, 1.6x at 748 MB, 1.9x at 1.5 GB of records (bench/hugepages_bench.py,
    bench/RESULTS.md "Huge pages"). Only maps that read: a file built in place
    (:meth:`RecordStore.build`) advised so built slower (2 M W1 rows, 2 process workers,
    first run: 3.5-5.0 s against 2.8-3.1 s). A refused advice (no transparent huge pages
    here) is the counted fallback ``"no_huge_pages"``, a refused populate (an older kernel)
    ``"no_populate"``, each asked until refused once per process: the same bytes, in small
    pages or faulted in by the checksum."""
    region = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    what = f"record file {name} ({nbytes} bytes)"
    if _HUGEPAGE is not None:
        _advise(region, _HUGEPAGE, "no_huge_pages", f"madvise(MADV_HUGEPAGE) of {what}")
    _advise(region, _POPULATE_READ, "no_populate", f"madvise(MADV_POPULATE_READ) of {what}")
    return region


def _advise(region: mmap.mmap, advice: int, fallback: str, what: str) -> None:
    """``madvise(advice)`` of ``region`` until the kernel refuses it once in this process:
    then the counted fallback ``fallback``, and no more asking. Through libc, which gives
    the GIL up: CPython's ``mmap.madvise`` holds it for the whole call, and populating a
    file that is not cached is a disk read (0.12-0.18 s per 246 MB here, every other
    thread of the loader stopped meanwhile)."""
    if fallback in _refused:
        return
    fn = libc_fn("madvise", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    if fn is None:  # no libc found: the same advice, the GIL held
        try:
            region.madvise(advice)
        except OSError as exc:
            _refused.add(fallback)
            note(fallback, f"{what} failed: {exc}")
        return
    view = np.frombuffer(region, dtype=np.uint8)
    address, nbytes = view.ctypes.data, view.nbytes
    del view  # no export left on the map: it can be closed
    if fn(address, nbytes, advice) != 0:
        err = ctypes.get_errno()
        _refused.add(fallback)
        note(fallback, f"{what} failed: {errno.errorcode.get(err, err)} {os.strerror(err)}")


class TileClaims:
    """Which process builds which tile of records built in place (:meth:`RecordStore.build`),
    across processes: a small file beside the record file (``<name>.tiles``) holds the
    temporary file's name and one state byte per tile, and a tile is built under an
    open-file-description lock on its byte (``F_OFD_SETLKW``: held per open file, so per
    process here; released by the kernel when its holder exits, so a killed builder's tile
    is built again by the next process that asks, never left half written as done). Threads
    of one process take turns on a tile before they ask here
    (:class:`stoker.loader.fastpath.rowmajor.Tiles`), and none holds two tiles' locks at
    once, so no two processes wait for each other.

    Why: process workers in natural order on a node's first run read their batches while the
    loader's process builds the same rows' records for them; building the tiles they read
    themselves, and copying their rows out of them, makes each row's columns read once."""

    #: open-file-description locks: Linux (3.15+); elsewhere no build is shared
    SUPPORTED = hasattr(fcntl, "F_OFD_SETLKW")

    def __init__(self, path: str, fd: int, states: mmap.mmap, target: str) -> None:
        self.path, self.target = path, target
        self._fd, self._states = fd, states
        self.close = weakref.finalize(self, _close_claims, fd, states)

    @classmethod
    def create(cls, path: str, target: str, tiles: int) -> TileClaims:
        """Claims for ``tiles`` tiles of temporary file ``target``, published as ``path``
        (atomically: a reader sees a whole header or no file)."""
        head = os.path.basename(target).encode()
        if len(head) >= _CLAIMS_HEADER:
            raise OSError(f"temporary record file name too long for {path}: {target}")
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".claims-")
        try:
            os.write(fd, head.ljust(_CLAIMS_HEADER, b"\0"))
            os.ftruncate(fd, _CLAIMS_HEADER + tiles)
            states = mmap.mmap(fd, _CLAIMS_HEADER + tiles, flags=mmap.MAP_SHARED)
            os.replace(tmp, path)
        except BaseException:
            os.close(fd)
            Path(tmp).unlink(missing_ok=True)
            raise
        return cls(path, fd, states, target)

    @classmethod
    def join(cls, path: str, root: str, tiles: int) -> TileClaims | None:
        """The claims published as ``path`` for ``tiles`` tiles, or ``None`` (none, or of
        another size, or no such locks here)."""
        if not cls.SUPPORTED:
            return None
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return None
        try:
            if os.fstat(fd).st_size != _CLAIMS_HEADER + tiles:
                os.close(fd)
                return None
            states = mmap.mmap(fd, _CLAIMS_HEADER + tiles, flags=mmap.MAP_SHARED)
        except OSError:
            os.close(fd)
            raise
        target = bytes(states[:_CLAIMS_HEADER]).rstrip(b"\0").decode()
        return cls(path, fd, states, os.path.join(root, target))

    def claim(self, t: int) -> bool:
        """Whether tile ``t`` is the caller's to build (its lock then held: :meth:`release`
        after), waiting while another process builds it; ``False``: built already."""
        self._lock(t, fcntl.F_WRLCK)
        if self._states[_CLAIMS_HEADER + t] == _DONE:
            self._lock(t, fcntl.F_UNLCK)
            return False
        return True

    def release(self, t: int, built: bool) -> None:
        """Give tile ``t``'s lock up, marked built if ``built``."""
        if built:
            self._states[_CLAIMS_HEADER + t] = _DONE
        self._lock(t, fcntl.F_UNLCK)

    def all_done(self) -> bool:
        """Whether every tile is built."""
        return self._states.find(b"\0", _CLAIMS_HEADER) < 0

    def _lock(self, t: int, kind: int) -> None:
        # struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks)
        fcntl.fcntl(self._fd, fcntl.F_OFD_SETLKW if kind != fcntl.F_UNLCK else
                    fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", kind, os.SEEK_SET,
                                                   _CLAIMS_HEADER + t, 1, 0))

    def withdraw(self) -> None:
        """The build is over (published or failed): no process joins it from now on."""
        Path(self.path).unlink(missing_ok=True)
        self.close()


def _close_claims(fd: int, states: mmap.mmap) -> None:
    """Close a :class:`TileClaims` (its locks go with its file description)."""
    states.close()
    os.close(fd)
