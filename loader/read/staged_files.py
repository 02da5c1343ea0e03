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
file (:class:`~stoker.loader.read.staging.StagedRecords`, the runs' pages advised first: one
read each, all in flight together), the others from the columns: the same bytes either way.

A stored file is checked before it is served, once per process: its checksum (reading it
whole), unless this node noted it as checked since its ``stat`` last changed
(:class:`~stoker.loader.read.indexed.hashed_files.HashedFiles`: a later process does not read
every file twice in its first epoch), then the shard's columns at rows drawn at random
(:mod:`stoker.loader.fastpath.record_check`); records that differ are the counted
``"records_mismatch"``: deleted, rebuilt, and the columns serve the shard meanwhile.
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
from stoker.loader.fastpath import record_check, rowmajor
from stoker.loader.fastpath.plan import FastPlan, ShardData
from stoker.loader.fastpath.record_store import RecordStore
from stoker.loader.fastpath.rowmajor import RecordLayout
from stoker.loader.fastpath.shard_records import lower_priority
from stoker.loader.jit import executors, fork_gate
from stoker.loader.read.indexed.hashed_files import HashedFiles
from stoker.loader.read.staging import StagedRecords
from stoker.manifest import Manifest

__all__ = ["StagedFiles"]

logger = logging.getLogger(__name__)


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
        self._notes = HashedFiles(store.root)
        self._served: dict[int, StagedRecords] = {}  # checked files, mapped
        self._queued: set[int] = set()  # shards built, or being built, by this process
        self._lock = threading.Lock()
        self._pool: tuple[int, ThreadPoolExecutor] | None = None
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
                 data_of: Callable[[int], ShardData]) -> StagedRecords | None:
        hit = self._served.get(shard)
        if hit is not None:
            return hit
        name = self._name(shard, layout)
        if not self._store.exists(name):
            return None
        rows = int(self._manifest.shard_rows[shard])
        path, nbytes = self._store.path(name), rows * layout.stride
        try:
            st = os.stat(path)
        except FileNotFoundError:  # evicted meanwhile
            return None
        if self._notes.known(path, name, st):
            found = self._store.map(name, nbytes)
        else:
            found = self._store.open(name, nbytes)  # reads and hashes it whole
            if found is not None:
                self._notes.remember(path, name, st)
        if found is None:
            return None
        records = found.reshape(rows, layout.stride)
        bad = record_check.first_mismatch(layout, data_of(shard), records)
        if bad is not None:
            note("records_mismatch", f"shard {shard}: stored records {name} in "
                                     f"{self._store.root} differ from the shard at row {bad.row} "
                                     f"(output {bad.field!r})")
            self._store.discard(name)
            with self._lock:
                self._queued.discard(shard)
            return None
        staged = self._served[shard] = StagedRecords(records, mapped=True)
        return staged

    # -- building ----------------------------------------------------------------------------
    def _build_later(self, shard: int, layout: RecordLayout) -> None:
        with self._lock:
            if shard in self._queued:
                return
            self._queued.add(shard)
            if self._pool is None or self._pool[0] != os.getpid():  # none yet, or forked
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
