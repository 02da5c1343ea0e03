"""Derived files (row-major record files) inside the node cache, under the cache's one budget.

The loader keeps per-shard row-major records as files in ``<cache dir>/row-major``
(:mod:`stoker.loader.fastpath.record_store`; the default records directory,
:func:`stoker.manifest.locations.records_dir`). When a cache has a byte ``limit``, those files
count against it together with the shards: the limit bounds shards + quarantined copies +
record files (written and being written), and every decision about them is taken under the
dataset's ``budget.lock`` (:mod:`stoker.cache.store.budget`), so the processes sharing a node
cache never overrun it together:

* admitting a shard counts the record files' bytes and, when room is needed, deletes the least
  recently used record files *first* (they can always be rebuilt from the shards), then files
  being written (their writers stop), then shards by the cache's policy
  (:class:`~stoker.cache.store.budget.Budget`);
* saving a record file (:class:`DerivedBudget`) deletes least recently used record files to
  make room and never a shard: when the shards leave no room, the records are not saved (the
  loader counts that as a named fallback; they stay in that process's memory).

A file being written reserves its final size in its name (``.writing-<bytes>.<name>.<random>.rec``)
from the moment it is created under the budget lock, as the shards' ``tmp/`` files do, so every
process counts every other's writes in progress. Its writer holds ``<name>.lock`` for as long as
it exists; one whose lock is free was left by a killed writer and is deleted when seen.

Record files are named by content, not by dataset, so a dataset's limit counts every record file
of the directory. Several datasets with limits in one cache directory each keep to their own
limit when they admit or save; a record file saved for one can take room that another's limit
counted as free until that one next admits a shard (which deletes record files first). A record
file deleted while a process maps it frees its disk blocks when that process unmaps it (the
inode lives until then), as for an evicted shard a reader still maps.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path

from stoker.cache.lock import FileLock
from stoker.cache.store.layout import Layout

__all__ = ["DerivedBudget", "DerivedFiles", "RECORD_SUFFIX", "TEMP_PREFIX"]

RECORD_SUFFIX = ".rec"
TEMP_PREFIX = ".writing-"
_TEMP = re.compile(r"^\.writing-(\d+)\.(.+\.rec)\.[^.]+\.rec$")
# How long a save waits for the budget lock before it gives up (the records stay in memory).
_LOCK_WAIT_S = 60.0
# A temporary file without a reservation in its name (older versions) is an orphan after this.
_ORPHAN_AGE = 3600.0

# (mtime, size, path) of one record file
RecordFile = tuple[float, int, str]


class DerivedFiles:
    """The record files of one directory: what they occupy, and deleting the oldest."""

    __slots__ = ("root",)

    def __init__(self, root: str) -> None:
        self.root = root

    def scan(self) -> tuple[list[RecordFile], list[RecordFile]]:
        """(record files, files being written with the bytes they reserve), least recently
        used first; deletes the temp files of killed writers."""
        files: list[RecordFile] = []
        writing: list[RecordFile] = []
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return files, writing
        for entry in entries:
            if not entry.name.endswith(RECORD_SUFFIX):
                continue
            try:
                st = entry.stat()
            except FileNotFoundError:
                published = self._published(entry.name)
                # a listing taken across the rename may hold both names: count it once
                if published is not None and \
                        os.path.basename(published[2]) not in {e.name for e in entries}:
                    files.append(published)
                continue
            if not entry.name.startswith(TEMP_PREFIX):
                files.append((st.st_mtime, st.st_size, entry.path))
                continue
            m = _TEMP.match(entry.name)
            if self._orphan(entry.name, st.st_mtime):
                try:
                    os.unlink(entry.path)
                    continue
                except FileNotFoundError:
                    pass  # renamed to its final name since the listing: count it still
            writing.append((st.st_mtime, max(st.st_size, int(m.group(1)) if m else 0),
                            entry.path))
        return sorted(files), sorted(writing)

    def used(self) -> int:
        """Bytes of record files, written and being written."""
        files, writing = self.scan()
        return sum(size for _, size, _ in files + writing)

    def _published(self, temp_name: str) -> RecordFile | None:
        """The record file a write in progress became since the listing (its writer renamed
        it: it holds no budget lock), or ``None``. Not counting it undercounted the directory
        by one record file, and a shard admitted into that room overran the limit by as much
        (tests/cache/test_records_budget.py's two processes, about 1 run in 10)."""
        path = self._record_of(temp_name)
        if path is None:
            return None
        try:
            st = os.stat(path)
        except FileNotFoundError:  # deleted, not published
            return None
        return st.st_mtime, st.st_size, path

    def _record_of(self, temp_name: str) -> str | None:
        """The path of the record file the temp file ``temp_name`` writes (``None``: not a
        temp file with a reservation in its name)."""
        m = _TEMP.match(temp_name)
        return None if m is None else os.path.join(self.root, m.group(2))

    def temp(self, name: str, nbytes: int) -> str:
        """Create (empty) the temporary file that writes ``name``, reserving ``nbytes``; the
        caller holds ``<name>.lock``."""
        fd, path = tempfile.mkstemp(dir=self.root, prefix=f"{TEMP_PREFIX}{nbytes}.{name}.",
                                    suffix=RECORD_SUFFIX)
        os.close(fd)
        return path

    def evict(self, used: int, need: int, limit: int, victims: list[RecordFile],
              keep: str | None = None) -> tuple[int, int]:
        """Delete ``victims`` in order (not ``keep``) until ``need`` more bytes fit ``limit``
        beside ``used``; (bytes used afterwards, files deleted). A file being written that
        is deleted makes its writer stop (``RecordStore.save``: records not saved)."""
        deleted = 0
        for _, size, path in victims:
            if used + need <= limit:
                break
            if os.path.basename(path) == keep:
                continue
            self._delete(path)
            Path(f"{path}.lock").unlink(missing_ok=True)  # only taken without waiting
            used -= size
            deleted += 1
        return used, deleted

    def _delete(self, path: str) -> None:
        """Delete a record file or a file being written. A write in progress may have been
        published since the scan that listed it (renamed to its record file: its writer holds
        no budget lock): then its record file holds the bytes the caller counts as freed, and
        goes instead; otherwise a shard admitted into that room would overrun the limit by one
        record file."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            record = self._record_of(os.path.basename(path))
            if record is not None:
                Path(record).unlink(missing_ok=True)

    def _orphan(self, name: str, mtime: float) -> bool:
        record = self._record_of(name)
        if record is None:
            return time.time() - mtime > _ORPHAN_AGE
        lock = FileLock(record + ".lock")
        if not lock.acquire(timeout=0):
            return False  # its writer is alive
        lock.release()
        return True


class DerivedBudget:
    """Room for record files in ``root`` under the cache ``limit`` of the dataset directory
    ``dataset_dir`` (a :class:`~stoker.cache.store.layout.Layout` root). Plain paths and a
    number: it pickles into worker processes, which share the limit through the lock file.
    """

    __slots__ = ("dataset_dir", "limit", "root")

    def __init__(self, dataset_dir: str, root: str, limit: int) -> None:
        self.dataset_dir = dataset_dir
        self.root = root
        self.limit = limit

    def __reduce__(self) -> tuple[object, ...]:
        return (DerivedBudget, (self.dataset_dir, self.root, self.limit))

    def reserve(self, name: str, nbytes: int) -> str | None:
        """The temp file that writes record file ``name`` (``nbytes``), created once the
        limit has room beside the shards, deleting least recently used record files (never a
        shard); ``None`` when the shards leave no room. The caller holds ``<name>.lock``."""
        files = DerivedFiles(self.root)
        lock = FileLock(os.path.join(self.dataset_dir, Layout.BUDGET_LOCK))
        if not lock.acquire(timeout=_LOCK_WAIT_S):
            return None  # the budget lock is only ever held briefly: something is stuck
        try:
            records, writing = files.scan()
            shards = sum(size for _, size, _ in Layout.committed_in(self.dataset_dir))
            used = shards + sum(size for _, size, _ in records + writing)
            # finished files only: another process's save in progress is not cancelled
            used, _ = files.evict(used, nbytes, self.limit, records, keep=name)
            if used + nbytes > self.limit:
                return None
            return files.temp(name, nbytes)
        finally:
            lock.release()
