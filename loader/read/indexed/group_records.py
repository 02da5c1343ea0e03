"""Records of indexed Parquet row groups kept on the node, so later runs decode nothing.

Parquet indexed in place is decoded a row group at a time and transposed into the stager's
records (:func:`stoker.loader.read.indexed.row_groups.plain_records`); every epoch of every
run did that again: decode-bound (5 M W1 rows: 0.6 M rows/s on later runs, a third of the same rows
as stoker shards, whose records are kept on the node). So a group's records are saved in the
node's record store (:mod:`stoker.loader.fastpath.record_store`: bounded, shared by every
process, checksummed, published by an atomic rename), named after the file's content hash,
the group and the record layout, and a later process maps them instead of decoding the group.

As for a shard's stored records, a file's checksum proves only that it is the file written,
so a group's records are compared with the Parquet file before they are served: every row of
:data:`CHECKED_COLUMNS` columns drawn at random, decoded from the group (a few percent of a
full decode). Records that differ are a counted, logged ``"records_mismatch"`` fallback: the
file is deleted and the group decoded (and saved again).
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from stoker.loader.fallbacks import note
from stoker.loader.fastpath import record_check
from stoker.loader.fastpath.record_store import RecordStore
from stoker.loader.fastpath.rowmajor import RecordLayout
from stoker.loader.fastpath.shard_records import lower_priority
from stoker.loader.jit import executors, fork_gate
from stoker.loader.read.staged_files import FileRecords, hashed_before, note_hashed, note_written

__all__ = ["CHECKED_COLUMNS", "GroupRecords", "first_mismatch"]

logger = logging.getLogger(__name__)

CHECKED_COLUMNS = 2  # columns of a group decoded to check its stored records
# saves waiting at once: each holds its group's records buffer (26 MB for 65,536 W1 rows)
# until written, so a disk slower than decoding must not pile them up in memory
_PENDING = 8


def first_mismatch(layout: RecordLayout, table: pa.Table, records: np.ndarray,
                   rows: np.ndarray | None = None) -> str | None:
    """The first column of ``table`` (some of a group's columns, decoded) whose values are
    not what ``records`` (``uint8 [rows, stride]``) hold for it, or ``None``. The records are
    those of plain columns (:func:`~stoker.loader.read.indexed.row_groups.plain_records`), so a
    value's bytes are the column's own. ``rows``: ``records`` holds only these rows of the
    group (sorted), and only they are compared."""
    if rows is not None:
        table = table.take(pa.array(rows))
    for f in layout.fields:
        view = records[:, f.offset:f.offset + f.nbytes].view(f.dtype)
        for j, name in enumerate(f.columns):
            if name not in table.column_names:
                continue
            column = table.column(name).combine_chunks()
            if f.kind == "list":
                values = column.values.to_numpy(zero_copy_only=False)
                start = column.offsets[0].as_py()
                want, got = values[start:start + len(column) * f.width], view
            else:
                want, got = column.to_numpy(zero_copy_only=False), view[:, j]
            if np.ascontiguousarray(want, dtype=f.dtype).tobytes() != \
                    np.ascontiguousarray(got).tobytes():
                return name
    return None


class GroupRecords:
    """Stored records of one indexed dataset's row groups (see the module docstring).

    Args:
        store: the node's record store.
        file_hash: ``file_hash(file)`` -> the file's xxh3-128 (from the manifest).
        read: ``read(file, group, columns)`` -> those columns of the group, as staging reads
            them (verified, cast to the manifest's types).
    """

    def __init__(self, store: RecordStore, file_hash: Callable[[int], str],
                 read: Callable[[int, int, list[str]], pa.Table],
                 past_memory: bool = False) -> None:
        self._store, self._hash, self._read = store, file_hash, read
        self._past_memory = past_memory
        self._pool: tuple[int, ThreadPoolExecutor] | None = None
        self._pending = 0
        self._lock = threading.Lock()
        self.mapped = 0  # groups served from stored records (statistics)

    def _name(self, file: int, group: int, rows: int, layout: RecordLayout) -> str:
        return self._store.name(f"{self._hash(file)}:row-group-{group}", rows, layout.key())

    def open(self, file: int, group: int, rows: int,
             layout: RecordLayout) -> np.ndarray | FileRecords | None:
        """The group's stored records (``uint8 [rows, stride]``, read-only), checked against
        the file; ``None`` when there are none (or they differed: deleted, counted). Past
        memory (``past_memory``) they are read, not mapped (a :class:`FileRecords`), hashed
        only the first time (a note beside the file), and checked at a run of rows, not all
        of them (stoker.loader.read.staged_files says why)."""
        name = self._name(file, group, rows, layout)
        path = self._store.path(name)
        records: Any = None
        checked = None
        if not (self._past_memory and hashed_before(path)):
            found = self._store.open(name, rows * layout.stride)  # hashed whole
            if found is None:
                return None
            records = found.reshape(rows, layout.stride)
        if self._past_memory:  # the mapping goes: its pages stay charged to the process
            if records is not None:
                note_hashed(path)
            try:
                records = FileRecords(os.open(path, os.O_RDONLY), layout.stride)
            except FileNotFoundError:
                return None
            checked = record_check.sample_block(rows)
        columns = [c for f in layout.fields for c in f.columns]
        picked = np.random.default_rng().choice(len(columns), min(CHECKED_COLUMNS,
                                                                 len(columns)), replace=False)
        bad = first_mismatch(layout, self._read(file, group, [columns[i] for i in picked]),
                             records if checked is None else records[checked], checked)
        if bad is not None:
            note("records_mismatch", f"row group {group} of indexed file {file}: stored records "
                                     f"{name} in {self._store.root} differ from the file in "
                                     f"column {bad!r}")
            self._store.discard(name)
            return None
        with self._lock:  # natural order opens two groups at once
            self.mapped += 1
        return records

    def advise(self, file: int, group: int, rows: int, layout: RecordLayout) -> None:
        """Ask the kernel to read the group's stored records, if any, into the page cache
        now (``POSIX_FADV_WILLNEED``): natural order asks for the group after the one it
        reads, so the disk streams that file while this one is checked and copied (20 M
        W1 rows in a 6 GiB cgroup: one synchronous read after another left the disk idle
        through each group's check)."""
        if not self._past_memory or not hasattr(os, "posix_fadvise"):
            return
        try:
            fd = os.open(self._store.path(self._name(file, group, rows, layout)), os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)

    def save(self, file: int, group: int, layout: RecordLayout, records: np.ndarray) -> None:
        """Save a decoded group's records in the background (a lower-priority thread, one at
        a time; ``records`` stay unchanged meanwhile: the caller's buffer is reused only once
        no view of it is alive). Past :data:`_PENDING` saves waiting, the group is not saved
        (a counted ``"records_not_saved"``; a later run saves it)."""
        name = self._name(file, group, len(records), layout)
        if self._store.exists(name):
            return
        with self._lock:
            if self._pending >= _PENDING:
                note("records_not_saved", f"row group {group} of indexed file {file}: "
                                          f"{_PENDING} saves were waiting for the disk")
                return
            self._pending += 1
            if self._pool is None or self._pool[0] != os.getpid():  # none yet, or forked
                self._pool = (os.getpid(),
                              ThreadPoolExecutor(1, thread_name_prefix="stoker-group-save"))
            self._pool[1].submit(self._save, name, records)

    def _save(self, name: str, records: np.ndarray) -> None:
        lower_priority()
        try:
            with fork_gate.unit():  # a file half written must not be split by a fork
                if self._store.save(name, records) and self._past_memory:
                    note_written(self._store.path(name))
        except OSError as exc:  # full disk, permissions: later runs decode the group again
            logger.warning("records of an indexed row group were not saved to %s: %s",
                           self._store.root, exc)
        finally:
            with self._lock:
                self._pending -= 1

    def wait(self) -> None:
        """Block until every save started so far is done (tests, benchmarks)."""
        pool = self._pool
        if pool is not None and pool[0] == os.getpid():
            pool[1].submit(lambda: None).result()

    def close(self) -> None:
        """Stop saving (a save under way finishes: the file is published whole or not)."""
        pool, self._pool = self._pool, None
        if pool is not None and pool[0] == os.getpid():
            executors.stop(pool[1], cancel_futures=False)

