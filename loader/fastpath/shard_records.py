"""When a source's open shards get row-major records, where they come from, and when they go.

:mod:`stoker.loader.fastpath.rowmajor` says what records are and how a batch reads them; this module
manages them for one :class:`~stoker.loader.read.arrow.ArrowSource`: a shard that opens
reserves memory from the budget, then maps its records from the node's store
(:mod:`stoker.loader.fastpath.record_store`; at once: ~10 ms per 250 MB, verified) or builds them (in a
background thread under ``"auto"``; batches use the column path meanwhile), and the process that
built them saves them for every later process and then serves the saved file itself (page cache
instead of private memory); a process whose worker processes wait for the file builds the
records straight into it (``RecordStore.build``: nothing to write afterwards). An evicted shard
gives its records and budget back.

A stored file is never trusted on its own checksum (that can be rewritten with the bytes):
every file this process maps and did not write itself is compared with the shard's columns at
rows drawn at random first (:mod:`stoker.loader.fastpath.record_check`; ~14 ms per 256 MB W1
shard, about what mapping and verifying the file costs, bench/records_check_bench.py). A file
that differs is a counted ``"records_mismatch"`` fallback: it is deleted from the store and
the records are rebuilt from the shard (and saved again); a forked worker that does not build
under ``"auto"`` serves the shard from its columns until another process saved its records
(:meth:`ShardRecords.look`).

Every decision about a shard is taken under the source's lock, against the source's own view
of which shards are open (``current``), so a shard closed while its records were being built
never gets them.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import sys
import threading
import time
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from stoker.cache.store.derived import DerivedFiles
from stoker.loader.fastpath import record_check, rowmajor, warm
from stoker.loader.fastpath.advise import advise_list_offsets, advise_runs, advise_whole
from stoker.loader.fastpath.ring import libc_fn
from stoker.loader.fallbacks import note
from stoker.loader.jit import executors, fork_gate
from stoker.loader.fastpath.record_store import RecordStore, TileClaims
from stoker.loader.fastpath.record_table import RecordTable

if TYPE_CHECKING:
    from stoker.cache.store.derived import DerivedBudget
    from stoker.loader.fastpath.plan import FastPlan, ShardData
    from stoker.manifest import Manifest

__all__ = ["ShardRecords", "lower_priority"]

logger = logging.getLogger(__name__)

# threads building records: a node's first run at 2 M W1 rows (4 shards of 250 MB, page cache
# dropped, 2 cores) read 0.80-1.02 M rows/s (median 0.91) with 2 against 0.66-0.97 M (0.83)
# with 1, 12 runs each alternating (session 26): a build waits on fresh pages as much as it
# computes
_BUILDERS = 2
_LOOK_S = 0.1  # seconds between a forked worker's looks for records another process saved
# longest a forked worker's shuffled batch waits for a shard's records being written by
# another process (a 600,000-row W1 shard builds in ~0.3 s, 2 process workers busy)
_SAVED_WAIT_S = 5.0


class ShardRecords:
    """Row-major records of a source's open shards.

    Args:
        plan: the source's fast plan (what the records hold).
        manifest: the dataset (shard content hashes name the stored files).
        row_major: ``True``, ``False`` or ``"auto"`` (see ``ArrowSource``).
        store_dir: the node's records directory, or ``None`` for memory only.
        lock: the source's lock; ``current(index, data)`` is called under it and says whether
            shard ``index`` is still open with ``data``.
        store_budget: the node cache's budget when ``store_dir`` is under its limit
            (:class:`stoker.cache.store.derived.DerivedBudget`), else ``None``.
    """

    def __init__(self, plan: FastPlan, manifest: Manifest, row_major: bool | str,
                 store_dir: str | None, lock: threading.Condition,
                 current: Callable[[int, ShardData], bool],
                 store_budget: DerivedBudget | None = None) -> None:
        self.mode = rowmajor.resolve_mode(row_major)  # bytes; 0: off, -1: unbounded
        self.store_dir = store_dir
        self.store_budget = store_budget
        self.table: RecordTable | None = None  # set when the first shard opens
        self.owner_pid = os.getpid()
        self.for_workers = False  # this process builds records that worker processes map
        self._plan, self._manifest = plan, manifest
        self._lock, self._current = lock, current
        self._budget = rowmajor.RowMajorBudget(self.mode)
        self._bytes: dict[int, int] = {}
        self._store: RecordStore | None = None
        self._pool: tuple[int, ThreadPoolExecutor, ThreadPoolExecutor] | None = None
        # a forked worker's open shards whose records another process may still save:
        # index -> (data, misfits, file name, bytes); see look()
        self._waiting: dict[int, tuple[ShardData, list[str], str, int]] = {}
        self._next_look = 0.0
        self._slow: set[int] = set()  # shards whose records wait_saved no longer waits for
        self._any_stored: bool | None = None  # see stored()
        self._builds: dict[Future[Any], int] = {}  # builds not finished -> their shard
        self._tiles: dict[int, rowmajor.Tiles] = {}  # this process's builds in progress
        # a forked worker's tiles of builds in place by its loader's process (_join)
        self._joined: dict[int, rowmajor.Tiles] = {}
        self._next_join: dict[int, float] = {}

    @property
    def nbytes(self) -> int:
        """Bytes reserved by the records of the open shards."""
        return self._budget.used

    def stored(self, index: int) -> bool:
        """Whether shard ``index``'s records are likely in the node's store, before it opens
        (a guess that only says how to open it: :class:`~stoker.loader.read.open_shards.OpenShards`):
        its file under the layout without misfits, or, before any shard opened (no layout
        yet), :meth:`any_stored`."""
        if self.mode == 0:
            return False
        with self._lock:
            table, store = self.table, self._store
        if table is None:
            return self.any_stored()
        name = self._name(store, index, table.layout, [])
        return name is not None and store.exists(name)  # type: ignore[union-attr]

    def any_stored(self) -> bool:
        """Whether the store holds any record file (asked once per source)."""
        if self._any_stored is None:
            try:
                self._any_stored = self.mode != 0 and self.store_dir is not None and \
                    bool(DerivedFiles(self.store_dir).scan()[0])
            except OSError:  # not a usable directory: open_store() says so, once
                self._any_stored = False
        return self._any_stored

    def opened(self, index: int, data: ShardData, batches: Sequence[pa.RecordBatch]) -> bool:
        """Shard ``index`` just opened: reserve budget and map, build or schedule its records.
        Whether records mapped from the store now serve every output of the shard (no
        column of it is read)."""
        with self._lock:
            if self.mode == 0:
                return False
            if self.table is None:
                self._store = self.open_store()
                self._advise_lists(data)
                layout = rowmajor.RecordLayout.of(self._plan, batches)
                if layout is None:
                    self.mode = 0
                    return False
                self.table = RecordTable(layout, self._manifest.num_shards)
            if self.mode > 0 and self._store is None and os.getpid() != self.owner_pid:
                return False  # "auto" in a forked worker: N workers would hold N private copies
            nbytes = int(data.starts[-1]) * self.table.layout.stride
            if nbytes == 0 or not self._current(index, data) or not self._budget.reserve(nbytes):
                return False
            self._bytes[index] = nbytes
            layout, store = self.table.layout, self._store
        name = self._name(store, index, layout, [])
        found = name is not None and store.exists(name)  # type: ignore[union-attr]
        # a file named for these bytes with no misfits: its builder found none in them, so
        # their list offsets need not be read again (the check still compares rows)
        misfits: list[str] = []
        if not found:
            self._advise_lists(data)
            misfits = layout.misfits(batches)
            if misfits:
                name = self._name(store, index, layout, misfits)
                found = name is not None and store.exists(name)  # type: ignore[union-attr]
        if self.mode < 0 or found:
            return self._get(index, data, misfits, name) and not misfits and self._serves_all()
        builders = self._pools()[0]
        with self._lock:
            if name is not None:  # a worker forked before the build maps it later (look())
                self._waiting[index] = (data, misfits, name, nbytes)
            if not self.for_workers and os.getpid() == self.owner_pid:
                # built in this process's memory: its batches may build tiles from now on
                self._tiles[index] = rowmajor.Tiles(layout, data, misfits)
        build = builders.submit(warm.after_first_batch, _gated, self._get_and_help, index,
                                data, misfits, name)
        with self._lock:
            self._builds[build] = index
        build.add_done_callback(self._built)
        return False

    def _built(self, build: Future[Any]) -> None:
        with self._lock:
            index = self._builds.pop(build, None)
        exc = None if build.cancelled() else build.exception()
        if exc is not None:  # not one _get names: a bug, said loudly (the columns serve)
            logger.error("building the row-major records of shard %s failed", index,
                         exc_info=exc)
            note("row_major_failed", f"shard {index}: {type(exc).__name__}: {exc}")

    def building(self) -> bool:
        """Whether this process has builds in progress (a cheap test before wait_built)."""
        return bool(self._builds) and self._building_here()

    def wait_built(self, shards: np.ndarray) -> bool:
        """Wait until this process's builds of ``shards``' records in progress are done;
        whether there were any (their records then serve, or a failed build fell back). A
        forked worker's copies of its parent's builds are not its own: they never finish."""
        wanted = set(shards.tolist())
        with self._lock:
            if not self._building_here():
                return False
            builds = [b for b, index in self._builds.items() if index in wanted]
        futures.wait(builds)
        return bool(builds)

    def _serves_all(self) -> bool:
        """Whether records serve every output of the plan (no column is read for a batch)."""
        with self._lock:
            return not self._plan.arrow_columns and self.table is not None and \
                {o.name for o in self._plan.outputs} == {f.name for f in self.table.fields}

    def _name(self, store: RecordStore | None, index: int, layout: rowmajor.RecordLayout,
              misfits: list[str]) -> str | None:
        """The store's file name for shard ``index``'s records (``None``: no store)."""
        if store is None:
            return None
        info = self._manifest.shards[index]
        return store.name(info.xxh3_128, info.rows, layout.key(misfits))

    def _advise_lists(self, data: ShardData) -> None:
        """Before reading every list offset of a shard opened advised (OpenShards): ask
        for their pages at once, not one fault at a time."""
        if data.random_advised:
            advise_list_offsets(data, [o.name for o in self._plan.outputs if o.kind == "list"])

    def dropped(self, index: int) -> None:
        """Shard ``index`` closed (call under the source's lock): release its records."""
        self._waiting.pop(index, None)
        self._tiles.pop(index, None)
        self._joined.pop(index, None)
        self._budget.release(self._bytes.pop(index, 0))
        if self.table is not None:
            self.table.remove(index)

    def close(self) -> None:
        """Release every shard's records; stop building (a started save finishes)."""
        with self._lock:
            for index in list(self._bytes):
                self.dropped(index)
            pool, self._pool = self._pool, None
        if pool is not None and pool[0] == os.getpid():
            executors.stop(pool[1])
            executors.stop(pool[2], cancel_futures=False)  # atomic either way

    def wait(self) -> None:
        """Block until every record started so far is built and saved (tests, benchmarks)."""
        with self._lock:
            pool, builds = self._pool, list(self._builds)
        if pool is not None and pool[0] == os.getpid():
            futures.wait(builds)  # builds first: they queue the saves
            pool[2].submit(lambda: None).result()

    def look(self) -> bool:
        """In a forked worker under ``"auto"`` (which builds no records of its own): map the
        records that another process saved since its shards opened, at most every
        ``_LOOK_S`` seconds; whether any were mapped. The loader's own process builds the
        records of the shards it opened before forking, so persistent workers on a node's
        first run would otherwise read those shards from their columns until they exit."""
        if not self._waiting or os.getpid() == self.owner_pid or \
                time.monotonic() < self._next_look:
            return False
        self._next_look = time.monotonic() + _LOOK_S
        store = self._store
        found = False
        for index, (data, misfits, name, nbytes) in list(self._waiting.items()):
            if store is None or not store.exists(name):
                continue
            with self._lock:
                self._waiting.pop(index, None)
                if not self._current(index, data):
                    continue
                if index not in self._bytes:  # a build of this process gave it back
                    if not self._budget.reserve(nbytes):
                        continue
                    self._bytes[index] = nbytes
            self._get(index, data, misfits, name)
            found = True
        return found

    def records_coming(self) -> bool:
        """Whether records of opened shards are on their way: built by this process
        (:meth:`wait_built`), or, in a forked worker, written into the store by another
        (:meth:`wait_saved`). A cheap test before either."""
        return self.building() or (bool(self._waiting) and os.getpid() != self.owner_pid)

    def wait_saved(self, shards: np.ndarray) -> bool:
        """In a forked worker under ``"auto"``: wait for the records of ``shards`` that
        another process (the loader's own, for its workers) is writing into the store, at
        most :data:`_SAVED_WAIT_S` seconds a shard, then map them (:meth:`look`); whether
        any were mapped. A shard whose wait timed out is not waited for again (the writer
        is stuck or slow: its rows keep coming from the columns)."""
        store = self._store
        if store is None or os.getpid() == self.owner_pid or not self._waiting:
            return False
        with self._lock:
            names = [(i, self._waiting[i][2]) for i in shards.tolist()
                     if i in self._waiting and i not in self._slow]
        if not names:
            return False
        for index, name in names:
            if not store.written(name, _SAVED_WAIT_S):
                self._slow.add(index)
        self._next_look = 0.0
        return self.look()

    # -- getting records ----------------------------------------------------------------------
    def _get_and_help(self, index: int, data: ShardData, misfits: list[str],
                      name: str | None) -> None:
        """:meth:`_get`, then :meth:`_help`."""
        self._get(index, data, misfits, name)
        self._help()

    def _help(self) -> None:
        """Build tiles of the shards other builder threads are building, the one with the
        most tiles left first, while no build waits for a thread: a shuffled first run's
        batches wait until every shard's records are built, and with one shard per thread a
        builder that finished early would sit idle while the last shard is built by one
        (2 M W1 rows, 2 builders: the last shard built 0.15 s after the other thread had
        finished)."""
        while True:
            with self._lock:
                if any(not b.running() and not b.done() for b in self._builds):
                    return  # a build waits: it is this thread's next
                busy = list(self._tiles.items())
            if not busy:
                return
            index, tiles = max(busy, key=lambda item: item[1].untaken())
            try:
                if not tiles.help():
                    return
            except (OSError, MemoryError) as exc:  # the tile was given back: the shard's
                # own builder builds it, and says so if it fails too
                logger.warning("a records builder stopped helping with shard %d: %s", index,
                               exc)
                return

    def _get(self, index: int, data: ShardData, misfits: list[str], name: str | None) -> bool:
        """Map or build shard ``index``'s records and serve them; whether they were mapped
        from the store (not built)."""
        table = self.table
        assert table is not None  # noqa: S101 - set before any shard gets here
        with self._lock:
            if not self._current(index, data):  # closed meanwhile (budget already released)
                return False
        try:
            records, built = self._records_of(index, data, misfits, name)
        except (OSError, MemoryError, ValueError, pa.ArrowException) as exc:
            # a named fallback: the column path still serves this shard
            note("row_major_failed", f"shard {index}: {type(exc).__name__}: {exc}")
            records, built = None, False
        except BaseException:
            with self._lock:
                self._tiles.pop(index, None)
            raise
        with self._lock:
            self._tiles.pop(index, None)  # with the table's add: batches see one or the other
            if records is None or not self._current(index, data):
                self._budget.release(self._bytes.pop(index, 0))
                return False
            table.add(index, records, misfits)
            self._waiting.pop(index, None)
            self._joined.pop(index, None)
        if built and self._store is not None and name is not None:
            # after add: the save then swaps the served records for the file's mapping
            try:
                self._pools()[1].submit(_gated, self._save, self._store, name, index, data,
                                        records, misfits)
            except RuntimeError as exc:  # closed, or the interpreter exits: a later run saves
                logger.debug("row-major records of shard %d not saved: %s", index, exc)
        return not built

    def open_store(self) -> RecordStore | None:
        """The node's record store these records use (``None``: none, or not usable)."""
        if self.store_dir is None:
            return None
        try:
            return RecordStore(self.store_dir, budget=self.store_budget)
        except OSError as exc:
            logger.warning("row-major records stay in memory: %s is not usable (%s)",
                           self.store_dir, exc)
            return None

    def _records_of(self, index: int, data: ShardData, misfits: list[str],
                    name: str | None) -> tuple[np.ndarray | None, bool]:
        """``(records, built in memory)``: mapped from the store's file ``name`` when it
        agrees with the shard at the checked rows (:meth:`_matches`), else built (the caller
        saves them); ``None`` in a forked worker under ``"auto"`` when the store has no good
        file (N workers would build N private copies). A forked worker that joined the
        file's build (:meth:`_join`) serves the map it built tiles in once every tile is
        built, by whichever process: each tile holds the bytes its builder copied from the
        shard, as the building process's own map does (which it serves unchecked too), so
        neither the file's digest nor the rows' check is computed again (~50 ms per 185 MB
        shard and worker)."""
        layout = self.table.layout  # type: ignore[union-attr]
        store = self._store
        if store is None or name is None:
            return self._build(index, layout, data, misfits), True
        rows = int(data.starts[-1])
        with self._lock:
            joined = self._joined.get(index)
        if joined is not None and joined.built_everywhere():  # the file's pages, as written
            records = joined.records.view()
            records.flags.writeable = False
            return records, False
        found = store.open(name, rows * layout.stride)
        if found is not None:
            records = found.reshape(rows, layout.stride)
            if self._matches(store, name, index, data, records, misfits):
                return records, False
        if self.mode > 0 and os.getpid() != self.owner_pid:
            return None, False
        if data.random_advised:  # opened for its records only (OpenShards): read it whole now
            data.random_advised = not advise_whole(data.arena)
        if self.for_workers:  # they map the file: built in place, mapped once it is written
            stored = store.build(name, rows * layout.stride,  # their batches build tiles too
                                 lambda out, claims: self._build(index, layout, data, misfits,
                                                                 out, claims),
                                 rowmajor.Tiles.count(rows)
                                 if TileClaims.SUPPORTED and not misfits else 0)
            if stored is not None:
                return stored.reshape(rows, layout.stride), False
        return self._build(index, layout, data, misfits), True

    def _build(self, index: int, layout: rowmajor.RecordLayout, data: ShardData,
               misfits: list[str], out: np.ndarray | None = None,
               claims: TileClaims | None = None) -> np.ndarray:
        """Build shard ``index``'s records (into ``out``, else new memory, where the shard's
        opening made its tiles already), tile by tile (rowmajor.Tiles): natural-order batches
        build the tiles they read meanwhile (:meth:`tiles`), those of worker processes too
        where ``claims`` says which process builds which tile (:meth:`_join`)."""
        with self._lock:
            tiles = self._tiles.get(index)
            if tiles is None or out is not None:
                tiles = self._tiles[index] = rowmajor.Tiles(layout, data, misfits, out, claims)
        return tiles.build()

    def tiles(self, index: int) -> rowmajor.Tiles | None:
        """Shard ``index``'s records while this process builds them, or, in a forked worker,
        while its loader's process builds them in place for it (:meth:`_join`), tile by
        tile, with every field (no misfits); else ``None``. A batch in natural order builds
        and reads the tiles its rows fall in (stoker.loader.read.arrow)."""
        own = self._building_here()
        with self._lock:
            tiles = own and self._tiles.get(index) or self._joined.get(index)
            waiting = self._waiting.get(index) if tiles is None and \
                os.getpid() != self.owner_pid else None
        if waiting is not None:
            tiles = self._join(index, *waiting)
        return None if tiles is None or tiles.skip else tiles

    def tiling(self) -> bool:
        """Whether this process builds records now, or is a forked worker whose loader's
        process may (a cheap test before :meth:`tiles`; a forked worker's copies of its
        parent's builds are not its own)."""
        return bool(self._tiles) and self._building_here() or \
            bool(self._waiting) and os.getpid() != self.owner_pid

    def _building_here(self) -> bool:
        return self._pool is not None and self._pool[0] == os.getpid()

    def _join(self, index: int, data: ShardData, misfits: list[str], name: str,
              nbytes: int) -> rowmajor.Tiles | None:
        """In a forked worker: the tiles of shard ``index``'s records that its loader's
        process is building in place into the store (RecordStore.join), which this worker's
        batches may build too (each tile once, across processes); ``None`` while there is no
        such build (asked again at most every ``_LOOK_S`` seconds)."""
        store, table = self._store, self.table
        now = time.monotonic()
        if misfits or store is None or table is None or now < self._next_join.get(index, 0.0):
            return None
        self._next_join[index] = now + _LOOK_S
        try:
            got = store.join(name, nbytes, rowmajor.Tiles.count(int(data.starts[-1])))
        except OSError as exc:  # as a failed build: the file, or the columns, serve
            self._next_join[index] = float("inf")
            note("row_major_failed", f"shard {index}: joining its build in {store.root}: "
                                     f"{type(exc).__name__}: {exc}")
            return None
        if got is None:
            return None
        tiles = rowmajor.Tiles(table.layout, data, misfits, *got)
        with self._lock:
            if index not in self._waiting or not self._current(index, data):
                return None
            return self._joined.setdefault(index, tiles)

    def _matches(self, store: RecordStore, name: str, index: int, data: ShardData,
                 records: np.ndarray, misfits: list[str]) -> bool:
        """Whether stored ``records`` agree with the shard's columns at the rows
        :mod:`~stoker.loader.fastpath.record_check` draws. If not: a counted, logged
        ``"records_mismatch"`` fallback, and the file is deleted from the store (the caller
        rebuilds the records from the shard and saves them again)."""
        layout = self.table.layout  # type: ignore[union-attr] - set before records are mapped
        rows = record_check.sample_rows(int(data.starts[-1]))
        if data.random_advised:  # opened for its records only: the checked rows' pages at once
            advise_runs(data, layout.fields, rows, rows + 1)
        bad = record_check.first_mismatch(layout, data, records, misfits, rows)
        if bad is None:
            return True
        note("records_mismatch", f"shard {index}: stored records {name} in {store.root} differ "
                                 f"from the shard at row {bad.row} (output {bad.field!r})")
        store.discard(name)
        return False

    def _save(self, store: RecordStore, name: str, index: int, data: ShardData,
              records: np.ndarray, misfits: list[str]) -> None:
        """Save in-memory records, then serve the file's mapping instead: page cache is
        shared and reclaimable, and gathers from it measured no slower. A file another
        process wrote first is checked against the shard before it replaces this process's
        own records (one that differs is deleted and these records are saved instead). The
        saving thread runs at a lower CPU priority (Linux): it must not slow the batches;
        and it writes past the page cache, which a low-priority helper process fills afterwards
        (``RecordStore.save(direct=True)``). Neither when it saves for worker processes
        (:attr:`for_workers`), which wait for the file and then read it at once (one 250 MB
        W1 shard's save, 2 process workers busy: 3.8 s niced, 1.2 s not)."""
        if not self.for_workers:
            lower_priority()
        mapped = None
        try:
            for _ in range(2):  # once more after a foreign file that differed was deleted
                wrote = store.save(name, records, direct=not self.for_workers)
                found = store.open(name, records.nbytes)
                mapped = None if found is None else found.reshape(records.shape)
                if mapped is None or wrote or self._matches(store, name, index, data, mapped,
                                                            misfits):
                    break
                mapped = None
        except OSError as exc:  # full disk, permissions: this process has them in memory
            logger.warning("row-major records of shard %d were not saved to %s: %s", index,
                           store.root, exc)
            return
        with self._lock:
            table = self.table
            if mapped is not None and table is not None and index in table \
                    and self._current(index, data):
                table.add(index, mapped.reshape(records.shape))

    def _pools(self) -> tuple[ThreadPoolExecutor, ThreadPoolExecutor]:
        """(builder, saver) threads of this process (a forked child makes its own)."""
        with self._lock:
            if not self._building_here():
                self._pool = (os.getpid(),
                              ThreadPoolExecutor(_BUILDERS, thread_name_prefix="stoker-rowmajor"),
                              ThreadPoolExecutor(1, thread_name_prefix="stoker-rowmajor-save"))
                self._builds = {}  # a forked child's copies of its parent's: never finish
                self._tiles = {}
            return self._pool[1], self._pool[2]


def _gated(fn: Callable[..., None], *args: Any) -> None:
    """``fn(*args)`` in a background thread, as one unit of the fork gate: it maps, reads and
    writes shard data and holds the source's lock, none of which a forked worker may inherit
    half done."""
    with fork_gate.unit():
        fn(*args)


def lower_priority() -> None:
    """Nice the calling thread (Linux threads have their own nice value) and put its disk
    reads in the idle I/O class (:func:`idle_io`); best effort."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):
        pass
    idle_io()


# ioprio_set(2) by machine (Linux only); IOPRIO_WHO_PROCESS names a thread by its id there
_IOPRIO_SET = {"x86_64": 251, "aarch64": 30, "ppc64le": 273, "s390x": 282}.get(
    platform.machine()) if sys.platform == "linux" else None
_IOPRIO_IDLE = 3 << 13  # IOPRIO_PRIO_VALUE(IOPRIO_CLASS_IDLE, 0)


def idle_io() -> bool:
    """Put the calling thread's disk reads in the idle I/O class, so a records builder reads
    its shard only while the loader's own reads leave the disk idle: past memory a node's
    first run reads rounds and builds records from the same disk (20 M W1 rows in a 6 GiB
    cgroup: 0.86 M rows/s with the builder idle against 0.77 M, the records built in both).
    Schedulers without priorities ignore it. Whether the kernel took it; a refusal is the
    counted fallback ``"no_io_priority"``."""
    syscall = None if _IOPRIO_SET is None else libc_fn("syscall", ctypes.c_long, ctypes.c_int,
                                                       ctypes.c_int, ctypes.c_int)
    if syscall is None:
        return False
    if syscall(_IOPRIO_SET, 1, threading.get_native_id(), _IOPRIO_IDLE) == 0:
        return True
    err = ctypes.get_errno()
    note("no_io_priority", f"ioprio_set(IDLE) failed: {os.strerror(err)}")
    return False
