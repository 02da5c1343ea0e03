"""Read samples of a stoker dataset by global id: memory-mapped shards, fused kernels.

A global sample id is the sample's index in the concatenation of the manifest's shards.
Uncompressed (memory-mapped, zero-copy) shards go through the fast path
(:mod:`stoker.loader.fastpath.plan`): Numba kernels gather the rows straight into reusable batch
buffers (:mod:`stoker.loader.fastpath.ring`). Otherwise (compressed shards, or ``features`` /
``categoricals`` the kernels cannot read) a batch groups its ids by shard, takes the rows from
each shard with pyarrow and restores the requested order with one more take
(:mod:`stoker.loader.read.arrow_batch`); both paths return equal batches. The shards
themselves are held open by :class:`~stoker.loader.read.open_shards.OpenShards`.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa

from stoker.loader.errors import WorkerError
from stoker.loader.fallbacks import note
from stoker.loader.fastpath import kernels, kernels_np, rowmajor
from stoker.loader.fastpath.convert import table_to_batch
from stoker.loader.fastpath.images import ImageOptions
from stoker.loader.fastpath.plan import FastPlan, NotZeroCopy, ShardData
from stoker.loader.fastpath.record_table import RecordTable
from stoker.loader.fastpath.advise import shards_fit_memory
from stoker.loader.fastpath.ring import BufferRing
from stoker.loader.fastpath.shard_records import ShardRecords
from stoker.loader.fastpath import warm
from stoker.loader.jit import aot, warmup
from stoker.loader.jit.search import distinct
from stoker.loader.order.options import OrderOptions
from stoker.loader.read.arrow_batch import arrow_batch
from stoker.loader.read.columns import check_categoricals, check_column_names, check_image_column
from stoker.loader.read.open_shards import OPENERS, NextShard, OpenShards, ShardOpener
from stoker.loader.read.order_plan import record_stride
from stoker.loader.read.staged_files import StagedFiles
from stoker.loader.read.staging import Stager
from stoker.manifest import (Manifest, ManifestError, ShardIntegrityError, StokerError, redact_url,
                             resolve_inside)

# check_column_names and ShardOpener live in their own modules; re-exported here, where callers
# have imported them from
__all__ = ["ArrowSource", "Digest", "ShardOpener", "check_column_names"]

# digest(batch, arrays) -> digests: see ArrowSource.fetch_digested
Digest = Callable[[dict[str, Any], Mapping[str, np.ndarray]], Any]

logger = logging.getLogger(__name__)

# groups fetch_group declines after one that found rows without records (still being built),
# unless records are added meanwhile
_GROUP_SKIP = 32
# rows and bytes a thread worker reads as one group (group_rows): 8192 W1 rows (3.3 MB) read
# fastest with 2 thread workers, 4096 and 16384 slower (bench/RESULTS.md "Workers and the GIL")
_GROUP_ROWS = 8192
_GROUP_BYTES = 4 << 20
#: most shards a dataset may have for process workers' consumer to open all of them before
#: forking (open_for_workers): ~37 ms each for stored records, opened 4 at once
_OPEN_ALL = 16


class ArrowSource:
    """Batches of a stoker dataset, as dicts of column name -> tensor (or list).

    Args:
        manifest: the dataset.
        columns: columns to read (default: all).
        features: numeric columns stacked into one float32 ``[B, K]`` tensor under
            ``"features"`` (and not returned separately).
        categoricals: integer or dictionary columns stacked into one int64 ``[B, C]`` tensor
            under ``"categoricals"`` (dictionary columns give their codes; nulls -> 0).
        opener: how to get a local file for a shard (the cache passes its own); by default
            the manifest's own location, which must then be local.
        max_open: shards kept open (memory maps are cheap; this bounds file handles).
        fast: use the Numba fast path where the shards allow it (``False``: always pyarrow).
        ring_depth: batch buffers kept for reuse by the fast path (see stoker.loader.fastpath.ring).
        pin: allocate those buffers in page-locked memory (needs CUDA).
        image: decode (and augment) this binary column into ``[B, H, W, 3]`` images.
        row_major: keep each open shard's fixed-width outputs (``features``,
            ``categoricals``, fixed-width columns, and list columns whose values all have one
            length and no nulls) as one row-major *record* per row, so a shuffled batch is one
            fused gather of a few contiguous cache lines per row instead of one miss per
            column (see stoker.loader.fastpath.rowmajor; batches are bitwise equal either way).
            ``"auto"``: records are mapped from ``row_major_dir`` when a shard opens, else
            built in a background thread (batches use the column path until then), while
            all records fit ``min(2 GiB, physical memory / 4)``; ``True``: built when the
            shard opens, no limit; ``False``: never; ``"staged"``: shuffled reads always
            stage rounds (see :meth:`stage`). Under ``"auto"``, a shuffled order whose records
            for the whole dataset exceed the budget stages its rounds instead
            (:mod:`stoker.loader.read.staging`: a working set bounded at any dataset size).
            Costs ``rows x stride`` bytes per open
            shard (stride: the outputs' bytes per row, each rounded up to 8). Forked worker
            processes (``worker_mode="process"``) build none under ``"auto"`` (each would
            hold its own) but map the stored ones.
        row_major_dir: keep the records in files there (:mod:`stoker.loader.fastpath.record_store`):
            built once per node, mapped by every later process (page cache, shared, not
            private memory); ``None``: in memory only. A directory that cannot be used is
            logged once and memory is used instead. When it is the node cache's records
            directory and the cache (``opener``) has a limit, record files count against that
            limit (:mod:`stoker.cache.store.derived`).
    """

    kind = "stoker"

    def __init__(self, manifest: Manifest, *, columns: Sequence[str] | None = None,
                 features: Sequence[str] | None = None, opener: ShardOpener | None = None,
                 max_open: int = 256, categoricals: Sequence[str] | None = None,
                 fast: bool = True, ring_depth: int = 8, pin: bool = False,
                 image: ImageOptions | None = None, row_major: bool | str = "auto",
                 row_major_dir: str | None = None) -> None:
        check_column_names(manifest, columns, features, categoricals)
        self.manifest = manifest
        self.fingerprint = manifest.fingerprint
        self.shard_rows = manifest.shard_rows
        self._starts = np.concatenate([[0], np.cumsum(self.shard_rows)]).astype(np.int64)
        self.features = list(features or ())
        self.categoricals = list(categoricals or ())
        both = set(self.features) & set(self.categoricals)
        if both:
            raise ValueError(f"column {sorted(both)[0]!r} is in both features= and "
                             "categoricals=; list it in one of them.")
        schema = manifest.arrow_schema
        wanted = list(columns) if columns is not None else list(schema.names)
        self.columns = list(dict.fromkeys(wanted + self.features + self.categoricals))
        check_categoricals(schema, self.categoricals)
        self.image = image
        if image is not None:
            check_image_column(schema, image)
            if image.column not in self.columns:
                self.columns.append(image.column)
        self._plan = FastPlan(schema, self.columns, self.features, self.categoricals, image) \
            if fast and getattr(manifest, "kind", "arrow") == "arrow" \
            and FastPlan.supports(schema, self.features, self.categoricals) else None
        #: an image plan without augmentation (whose crop and resize are kernels) reads its
        #: batches with the kernels' NumPy twins only: for images they are as fast (a decode
        #: per row dominates), and a process then never imports Numba nor loads its kernels
        #: (~0.75 s holding the GIL: W2 fresh process, 2 threads, 30-36 k -> 45-47 k
        #: images/s). ``STOKER_COLD_START=wait`` keeps the kernels.
        self.numba_free = self._plan is not None and image is not None and image.identity \
            and not warmup.kernels_wait()
        if self.numba_free:
            row_major = False  # records are built and read by kernels
        self._ring = BufferRing(ring_depth, pin)
        self._group_skip = (0, 0)  # (records then, groups left to decline): fetch_group
        self.batches_grouped = 0  # batches fetch_group served
        # batches still to gather before one may wait for records (_wait_for_records): the
        # first, or a first group read batch by batch (fetch_group)
        self._firsts = 1
        self.records_waits = 0  # batches that waited for records being built (and seconds)
        self.rows_from_tiles = 0  # rows read from records while built (_gather_tiles)
        self.records_wait_s = 0.0
        self._local = opener is None  # shards read in place, not through a cache
        self._opener = opener or self._local_opener
        self._lock = threading.Condition()
        self._shards = OpenShards(manifest, self.columns, self._opener, max_open, self._lock,
                                  shard_data=self._shard_data, describe=self._describe,
                                  opened=self._shard_opened, dropped=self._shard_dropped,
                                  openers=OPENERS if opener is None else 1,
                                  stored=self._shard_stored)
        self._data = self._shards.data
        self.opened_shards = self._shards.opened_shards
        self._force_stage = row_major == "staged"
        if self._force_stage:
            row_major = "auto"
        # a cache's opener says whether the records directory is under the cache's limit
        budget = getattr(opener, "derived_budget", None)
        self._rm = ShardRecords(self._plan, manifest, row_major, row_major_dir, self._lock,
                                lambda index, data: self._data.get(index) is data,
                                budget(row_major_dir) if budget and row_major_dir else None) \
            if self._plan is not None else None
        self._stager: Stager | None = None
        self._files: StagedFiles | None = None  # stored records of staged rounds
        self._opened_ahead: set[int] = set()  # shards open_for_workers opened
        self._next = NextShard(self._shards, self._starts)  # see open_next
        self._records_mode = self._rm.mode if self._rm is not None else 0  # bytes; -1: any
        records = bool(self._rm and self._rm.mode)
        # records through the gather compiled ahead of time (stoker.loader.jit.aot) may serve
        # batches (not under STOKER_COLD_START=wait, where no batch is read by the NumPy twins)
        aot_ok = self._plan is not None and not self.numba_free and not warmup.kernels_wait()
        ahead_records = aot_ok and records and aot.function("record_gather") is not None
        #: where the kernels compiled ahead of time also gather every output from the columns
        #: (kernels_np.ahead) and build the records (or no records are wanted:
        #: ``row_major=False``), no batch ever wants the JIT kernels: a node's first run
        #: included (shuffled batches wait for the records being built, _wait_for_records)
        self._ahead = aot_ok and kernels_np.ahead.covers(self._plan) and (
            not records or ahead_records and
            rowmajor.built_ahead(self._plan))  # type: ignore[arg-type]
        #: the plan's JIT kernels are warmed once a batch or a shard needs them, not before,
        #: where stored records may serve every batch, or where no batch wants them (_ahead):
        #: such a process never imports Numba, whose start-up holds the GIL ~1 s against the
        #: shard opens and builds
        self._warm_later = self._ahead or \
            ahead_records and self._rm.any_stored()  # type: ignore[union-attr]
        self._warm = ((warm.plan_key(self._plan, records) if self._warm_later else
                       warm.start(self._plan, schema, records)), self._plan, schema, records) \
            if self._plan is not None and not self.numba_free else None

    def _kernels_ready(self) -> bool:
        """Whether batches may call the plan's JIT kernels now (warm.ready); not while their
        warm-up waits for a batch that needs them (``_warm_later``)."""
        return not self._warm_later and warm.ready(*self._warm)  # type: ignore[misc]

    def _warm_now(self) -> None:
        """A batch or a shard needs the plan's JIT kernels: start their warm-up."""
        if self._warm_later:
            self._warm_later = self._ahead = False
            warm.start(*self._warm[1:])  # type: ignore[index]

    def stage(self, options: OrderOptions, rank: int, world_size: int) -> bool:
        """Read shuffled batches through staging rounds (:mod:`stoker.loader.read.staging`) for
        this rank's order instead of per-shard records; whether the fast path allows it
        (natural order reads consecutive rows and needs no staging)."""
        return self.stage_with(options, lambda plan, runs_of, ahead: Stager(
            plan, options, rank, world_size, self.shard_rows, self.fingerprint, self._starts,
            runs_of, stage_ahead=ahead))

    def stage_with(self, options: OrderOptions,
                   make: Callable[[FastPlan, Callable[..., Any], bool], Any]) -> bool:
        """:meth:`stage` with the stager ``make(plan, runs_of, stage_ahead)`` builds (a
        mixture's, stoker.loader.read.mixture_staging, whose order is not this reader's)."""
        if self._plan is None or not options.shuffle or not self._records_mode \
                or (not self._force_stage and self._records_fit()):
            return False
        if self._stager is not None:
            self._stager.close()
        past_memory = not shards_fit_memory(int(self.manifest.shard_bytes.sum()))
        self._shards.random_access = past_memory
        files = self._staged_files(past_memory)
        runs_of: Callable[..., Any] = (lambda s, *rows: [(self._data_of(s), *rows)]) \
            if files is None else (lambda s, *rows: files.runs_of(s, *rows, self._data_of))
        self._stager = make(self._plan, runs_of, self._opener == self._local_opener)
        if self._rm is not None:
            self._rm.close()
        self._rm = None
        if not self._ahead:  # rounds are staged by kernels (compiled ahead of time: _ahead)
            self._warm_now()
        return True

    def _staged_files(self, past_memory: bool) -> StagedFiles | None:
        """Stored records for the rounds (stoker.loader.read.staged_files): for local shards
        that do not fit memory, where there is a records directory."""
        if self._files is not None:
            self._files.close()
            self._files = None
        store = self._rm.open_store() if self._rm is not None else None
        if not (past_memory and self._local and store is not None):
            return None
        need = int(self.shard_rows.sum()) * self._stride
        if need > store.limit:  # they would evict each other every epoch, rebuilt forever
            note("records_not_saved", f"{need} bytes of records for the staged rounds exceed "
                                      f"the records directory's limit of {store.limit} bytes "
                                      f"({store.root}): rounds read the shards' columns")
            return None
        self._files = StagedFiles(store, self.manifest, self._plan,  # type: ignore[arg-type]
                                  lambda: getattr(self._stager, "layout", None),
                                  lambda s: self._local_opener(s).__enter__())
        return self._files

    def _records_fit(self) -> bool:
        """Whether every shard's records fit the records budget (``row_major=True``: always):
        then per-shard records, built once per node and mapped, serve shuffled batches
        fastest; beyond it, rounds are staged (a bounded working set at any size)."""
        if self._records_mode < 0:
            return True
        # the whole budget: 5 M W1 rows (1.96 GB of records, 2 GiB) build them all and read
        # 5-7 M rows/s on later epochs against 3-4 M staged; a node's first epoch is slower
        # (bench/RESULTS.md, "Workers (5,000,000 W1 rows)"). Half was used after a build at
        # f259aef kept only 1.1 GB of them (0.19 M rows/s); today's builds all, any workers.
        return self._records_bytes <= self._records_mode

    @functools.cached_property
    def _records_bytes(self) -> int:
        """Bytes of every shard's records."""
        return int(self.shard_rows.sum()) * self._stride

    def records_over_budget(self) -> tuple[int, int] | None:
        """``(bytes of every shard's records, the records budget)`` when the records exceed
        the budget (a shuffled order then stages rounds, :meth:`stage`), else ``None``."""
        if self._plan is None or self._records_mode <= 0 or self._records_fit():
            return None
        return self._records_bytes, self._records_mode

    @property
    def stager(self) -> Stager | None:
        """The staging of shuffled rounds, when :meth:`stage` enabled it."""
        return self._stager

    @property
    def fast(self) -> bool:
        """Whether batches can use the fast path (shards are checked as they are opened)."""
        return self._plan is not None

    @property
    def ring(self) -> BufferRing:
        """The reusable batch buffers of the fast path."""
        return self._ring

    # -- shard access (stoker.loader.read.open_shards) ------------------------------------
    def _local_opener(self, index: int) -> AbstractContextManager[str]:
        location = self.manifest.shard_location(index)
        if "://" in location and not location.startswith("file://"):
            raise ManifestError(f"{redact_url(location)}: remote shards need a cache; pass "
                                "cache_dir=... to the DataLoader.")
        root = (self.manifest.root or ".").removeprefix("file://")
        return nullcontext(resolve_inside(root, self.manifest.shards[index].path,
                                          f"shards[{index}].path"))

    def _table(self, index: int) -> pa.Table:
        """Shard ``index`` as a table, opening (and pinning) it if needed."""
        return self._shards.table(index)

    def _data_of(self, index: int) -> ShardData:
        return self._shards.data_of(index)

    def _shard_opened(self, index: int, data: ShardData,
                      batches: Sequence[pa.RecordBatch]) -> bool:
        """A zero-copy shard opened: its rows feed the staging rounds, or its records;
        whether stored records serve all of it (see OpenShards)."""
        if self._stager is not None:
            self._stager.opened(batches)
            return False
        served = self._rm is not None and self._rm.opened(index, data, batches)
        if not served and not self._ahead:  # its columns are read: by the JIT kernels
            self._warm_now()
        return served

    def _shard_stored(self, index: int) -> bool:
        """Whether shard ``index``'s records are likely stored (see OpenShards)."""
        return self._stager is None and self._rm is not None and self._rm.stored(index)

    def _shard_dropped(self, index: int) -> None:
        if self._rm is not None:
            self._rm.dropped(index)

    # -- row-major records (stoker.loader.fastpath.shard_records) --------------------------------------
    @property
    def _records(self) -> RecordTable | None:
        return self._rm.table if self._rm is not None else None

    def wait_row_major(self) -> None:
        """Block until every row-major record started so far is built and saved (tests,
        benchmarks)."""
        if self._rm is not None:
            self._rm.wait()
        if self._files is not None:
            self._files.wait()

    @property
    def row_major_bytes(self) -> int:
        """Bytes reserved by the row-major records of the open shards."""
        return self._rm.nbytes if self._rm is not None else 0

    def _shard_data(self, batches: Sequence[pa.RecordBatch],
                    arena: pa.Buffer) -> ShardData | None:
        """Kernel inputs for a shard, or ``None`` when it is not zero-copy (e.g. compressed)."""
        if self._plan is None or not batches:
            return None
        try:
            return ShardData(batches, arena, self._plan.kernel_columns)
        except NotZeroCopy:
            return None

    # -- reading --------------------------------------------------------------------------
    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard index, row within shard) of each global id."""
        shard = np.searchsorted(self._starts, ids, side="right") - 1
        return shard, ids - self._starts[shard]

    def take(self, ids: np.ndarray, columns: Sequence[str] | None = None) -> pa.Table:
        """Rows ``ids`` (global) of ``columns`` (default: all read) as one Arrow table, in the
        given order: grouped by shard, one take per shard, then the order restored."""
        ids = np.asarray(ids, dtype=np.int64)
        columns = self.columns if columns is None else list(columns)
        if len(ids) == 0:
            return self._empty(columns)
        shard, row = self.locate(ids)
        by_shard = np.argsort(shard, kind="stable")
        bounds = np.flatnonzero(np.diff(shard[by_shard])) + 1
        pieces = []
        for group in np.split(by_shard, bounds):
            s = int(shard[group[0]])
            try:
                pieces.append(self._piece(s, row[group], columns))
            except StokerError:  # typed errors (integrity, cache, manifest) name the shard
                raise
            except Exception as exc:  # name the shard and samples, keep the cause
                raise WorkerError(f"reading {self._describe(s)} for samples "
                                  f"{_shown(ids[group])} failed: {type(exc).__name__}: "
                                  f"{exc}") from exc
        table = pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]
        if len(pieces) > 1:
            inverse = np.empty_like(by_shard)
            inverse[by_shard] = np.arange(len(by_shard))
            table = table.take(pa.array(inverse))
        return table

    # The three steps a source over other files (IndexSource) replaces.
    def _empty(self, columns: list[str]) -> pa.Table:
        return self.manifest.arrow_schema.empty_table().select(columns)

    def _piece(self, index: int, rows: np.ndarray, columns: list[str]) -> pa.Table:
        return self._table(index).select(columns).take(pa.array(rows))

    def _describe(self, index: int) -> str:
        return f"shard {index} ({redact_url(self.manifest.shard_location(index))})"

    def fetch(self, ids: np.ndarray, epoch: int = 0, seed: int = 0) -> dict[str, Any]:
        """The batch dict for ``ids``: ``features`` and ``categoricals`` stacked, images
        decoded (augmented from ``(seed, epoch, id)``), other columns converted (see
        stoker.loader.fastpath.convert for the rules)."""
        return self.fetch_digested(ids, epoch, seed, None)[0]

    def fetch_digested(self, ids: np.ndarray, epoch: int, seed: int,
                       digest: Digest | None) -> tuple[dict[str, Any], Any]:
        """:meth:`fetch`, and ``digest(batch, arrays)`` computed on the batch as soon as it is
        built, before anyone else sees it (``None``: not called, ``None`` returned).
        ``arrays``: the NumPy arrays behind the batch's fixed-width tensors, by batch key,
        just written by the kernels and still in cache; the loader's ledger hashes them
        (stoker.loader.ledger.digest) without reading each tensor's attributes."""
        ids = np.asarray(ids, dtype=np.int64)
        if self._plan is not None and len(ids):
            slot = self._ring.acquire()
            try:
                # or still compiling (past memory the kernels are waited for: a batch from
                # the columns there costs a disk read per column and row)
                twins = self.numba_free or self._ahead or (not self._shards.random_access and
                                                           not self._kernels_ready())
                try:  # their NumPy twins write the same bytes now, from the same shards
                    filled, groups, rest = self._gather_twins(ids, slot, epoch, seed) if twins \
                        else self._gather_records(ids, slot, epoch, seed)
                except NotZeroCopy as exc:  # a named fallback: counted, logged, in the ledger
                    note("not_zero_copy", f"{exc} (batch of samples {_shown(ids)})")
                except WorkerError as exc:  # a shard that cannot be opened: add the batch
                    raise WorkerError(f"{exc} (reading samples {_shown(ids)})") from exc
                except StokerError:
                    raise
                except Exception as exc:
                    raise WorkerError(f"reading the batch of samples {_shown(ids)} failed: "
                                      f"{type(exc).__name__}: {exc}") from exc
                else:
                    arrays: dict[str, np.ndarray] = {}
                    batch = self._plan.run(groups, len(ids), slot,
                                           lambda cols: table_to_batch(self.take(ids, cols)),
                                           (ids, self.fingerprint, seed, epoch), filled, rest,
                                           (kernels_np.ahead if self._ahead else kernels_np)
                                           if twins else kernels, arrays)
                    if twins:  # the warm-ups held back for the first batch compile now
                        warm.served()
                    return batch, None if digest is None else digest(batch, arrays)
            finally:
                self._ring.release(slot)
        batch = self._fetch_arrow(ids, epoch, seed)
        return batch, None if digest is None else digest(batch, {})

    @property
    def group_rows(self) -> int:
        """Rows a worker should read as one group (:meth:`fetch_group`), at most
        ``_GROUP_BYTES`` of records; 0 when no batch of this source can be grouped (outputs
        records never serve)."""
        plan = self._plan
        if plan is None or plan.arrow_columns or self._records_mode == 0 or \
                any(o.kind not in ("fixed", "matrix", "list") for o in plan.outputs):
            return 0
        return max(1, min(_GROUP_ROWS, _GROUP_BYTES // max(1, self._stride)))

    @functools.cached_property
    def _stride(self) -> int:
        """Bytes of one row's record (stoker.loader.read.order_plan.record_stride: it may read
        a shard's first record batch, so it is computed once)."""
        return record_stride(self.manifest, self.columns, self.features, self.categoricals,
                             self.image)

    def fetch_group(self, batches: Sequence[np.ndarray], epoch: int, seed: int,
                    digest: Digest | None, into: Any = None
                    ) -> list[tuple[dict[str, Any], Any]] | None:
        """:meth:`fetch_digested` of several batches from one record gather, or ``None``
        when they cannot be served that way (the caller then fetches them one by one).

        A thread worker serving one batch at a time hands the GIL back and forth around
        every kernel call, and on this kind of machine a hand-over costs ~30 us (a thread
        waking another): more than a natural-order W1 batch's copy (bench/gil_bench.py).
        One gather for several batches makes the nogil part long enough for two workers to
        overlap. Served only when every output of every row comes from row-major records or
        from staged rounds (fixed widths: each batch is a row slice of the group, bitwise
        what :meth:`fetch_digested` gives); batches are views of one ring slot, or of
        ``into`` when given (a process worker's shared-memory slot,
        stoker.loader.workers.transport.Region: the consumer reads the batches there). A
        group of staged rows holds at most two rounds at once, as a batch across a round's
        end does. A first group read batch by batch is delivered whole: none of its batches
        waits for records being built (:meth:`_wait_for_records`), as a first batch does not.
        """
        got = self._fetch_group(batches, epoch, seed, digest, into)
        if got is None and self._firsts:
            self._firsts = len(batches)
        return got

    def _fetch_group(self, batches: Sequence[np.ndarray], epoch: int, seed: int,
                     digest: Digest | None, into: Any
                     ) -> list[tuple[dict[str, Any], Any]] | None:
        plan, table, stager = self._plan, self._records, self._stager
        if plan is None or len(batches) < 2 or self.numba_free or \
                not (self._warm_later or self._kernels_ready()) or \
                (stager is None and (table is None or not len(table))):
            return None
        held, skip = self._group_skip
        if skip > 0 and (stager is not None or held == len(table)):  # nothing new since a miss
            self._group_skip = (held, skip - 1)
            return None
        sizes = [len(b) for b in batches]
        ids = np.concatenate([np.asarray(b, dtype=np.int64) for b in batches])
        slot = self._ring.acquire() if into is None else into
        try:
            try:  # at most the two rounds a batch across a round's end holds
                got = self._gather_opening(ids, slot, probe=True) if stager is None \
                    else stager.gather(ids, slot, epoch, seed, most=2)
            except NotZeroCopy:  # the batches' own fetch notes it as a fallback
                return None
            if got is None:
                return None
            filled, positions = got
            if len(positions) or any(o.name not in filled for o in plan.outputs):
                # records still being built, or a field the stager leaves out
                self._group_skip = (0 if table is None else len(table), _GROUP_SKIP)
                return None
            out: list[tuple[dict[str, Any], Any]] = []
            lo = 0
            for n in sizes:
                arrays: dict[str, np.ndarray] = {}
                part = {name: arr[lo:lo + n] for name, arr in filled.items()}
                batch = plan.run([], n, slot, dict, None, part, (), kernels, arrays)
                out.append((batch, None if digest is None else digest(batch, arrays)))
                lo += n
            self.batches_grouped += len(out)
            return out
        finally:
            if into is None:
                self._ring.release(slot)

    def _gather_twins(self, ids: np.ndarray, slot: Any, epoch: int, seed: int
                      ) -> tuple[dict[str, np.ndarray], list[Any], list[Any]]:
        """:meth:`_gather_records` while the JIT kernels compile or load, counted as a
        ``"compiling"`` fallback: outputs from the records the node stored, copied by NumPy or
        the gather compiled ahead of time (a shard whose records are stored is opened without
        reading its columns: see :class:`~stoker.loader.read.open_shards.OpenShards`), the
        rest from the columns. No fallback where that gather served the whole batch before
        any JIT kernel was wanted (``_warm_later``): nothing waited for a compile; nor where
        the columns' twins compiled ahead of time serve every output (``_ahead``): the batch
        is the kernels' own work, without Numba (staged rounds included)."""
        assert self._plan is not None  # noqa: S101
        if self.numba_free or self._stager is not None and not self._ahead:
            if not self.numba_free:
                note("compiling", f"batch of samples {_shown(ids)}")
            return {}, self._plan.groups(ids, self._starts, self._data_of), []
        filled, groups, rest = self._gather_records(ids, slot, epoch, seed, numpy=True)
        if self._ahead:
            return filled, groups, rest  # the columns' twins compiled ahead of time serve
        if self._warm_later and not groups and not rest:
            return filled, groups, rest  # all from the gather compiled ahead of time
        self._warm_now()
        note("compiling", f"batch of samples {_shown(ids)}")
        return filled, groups, rest

    def _gather_records(self, ids: np.ndarray, slot: Any, epoch: int = 0, seed: int = 0,
                        numpy: bool = False) -> tuple[dict[str, np.ndarray], list[Any], list[Any]]:
        """Outputs written from row-major records (by NumPy when ``numpy``), then the groups
        the column kernels need: ``(filled, groups of every row for the other outputs, groups
        of the rows without records for the filled outputs)`` (see :meth:`FastPlan.run`)."""
        assert self._plan is not None  # noqa: S101
        plan = self._plan
        if self._stager is not None:
            filled, positions = self._stager.gather(ids, slot, epoch, seed)
            lists = {f.name for f in self._stager.fields if f.kind == "list"}
        else:
            filled, positions = self._gather_opening(ids, slot, numpy)
        rest: list[Any] = []
        if filled and len(positions):
            if self._stager is None:
                layout = self._records.layout  # type: ignore[union-attr] - filled: records
                lists = {f.name for f in layout.fields if f.kind == "list"}
            filled = {name: arr for name, arr in filled.items() if name not in lists}
            rest = [(data, chunk, row, positions[dest]) for data, chunk, row, dest
                    in plan.groups(ids[positions], self._starts, self._data_of)]
        others = any(o.name not in filled for o in plan.outputs)
        groups = plan.groups(ids, self._starts, self._data_of) if others else []
        return filled, groups, rest

    def _gather_once(self, ids: np.ndarray, slot: Any,
                     numpy: bool = False) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Record-served outputs of ``ids`` and the batch positions of rows without records."""
        table = self._records
        if table is None:
            return {}, np.arange(len(ids))
        if len(table):
            filled, positions, touched = table.gather(ids, self._starts, slot, numpy=numpy)
            if len(touched):
                self._shards.touch(touched)
        else:
            filled, positions = {}, np.arange(len(ids))
        if len(positions) and self._rm is not None and self._rm.tiling():
            return self._gather_tiles(ids, slot, filled, positions)
        return filled, positions

    def _gather_tiles(self, ids: np.ndarray, slot: Any, filled: dict[str, np.ndarray],
                      positions: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Rows at batch ``positions`` (without records) from the records of their shard
        that this process is building (or, in a forked worker, that its loader's process is
        building in place for it: ShardRecords.tiles), when they are consecutive rows of one
        shard (natural order): their tiles built here unless taken (rowmajor.Tiles), then
        copied out whole. ``(filled, positions still without records)``."""
        rows = ids[positions]
        if not (_contiguous(rows) and _contiguous(positions)) or \
                not (self._ahead or warm.usable(kernels.copy_ranges)):  # no compile here
            return filled, positions
        shard, lo = (int(v[0]) for v in self.locate(rows[:1]))
        tiles = self._rm.tiles(shard)  # type: ignore[union-attr] - tiling() was asked
        if tiles is None or lo + len(rows) > tiles.rows:
            return filled, positions
        try:
            records = tiles.read(lo, lo + len(rows))
        except (OSError, MemoryError, ValueError) as exc:  # as a failed build: columns serve
            note("row_major_failed", f"shard {shard}, rows {lo}-{lo + len(rows)}: "
                                     f"{type(exc).__name__}: {exc}")
            return filled, positions
        p = slice(int(positions[0]), int(positions[-1]) + 1)
        for f in self._records.fields:  # type: ignore[union-attr] - records are built
            out = filled.get(f.name)
            if out is None:
                out = filled[f.name] = slot.array(f.name, (len(ids), f.width), f.dtype)
            out[p].view(np.uint8)[:] = records[:, f.offset:f.offset + f.nbytes]
        with self._lock:
            self.rows_from_tiles += len(rows)
        self._shards.touch(np.array([shard]))
        return filled, positions[:0]

    def _gather_opening(self, ids: np.ndarray, slot: Any, numpy: bool = False,
                        probe: bool = False) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """:meth:`_gather_once`, again after opening the shards of the rows it found without
        records when there were closed ones (opened shards map stored records), or after a
        forked worker mapped records another process saved meanwhile (ShardRecords.look),
        or after waiting for records being built (:meth:`_wait_for_records`; not for a
        ``probe``: a group of batches, fetch_group, that is read batch by batch unless every
        row has records)."""
        filled, positions = self._gather_once(ids, slot, numpy)
        if len(positions) and (self._open_shards_of(ids[positions]) or
                               (self._rm is not None and self._rm.look()) or
                               (not probe and self._wait_for_records(ids[positions]))):
            filled, positions = self._gather_once(ids, slot, numpy)
        if not probe:
            self._firsts = max(0, self._firsts - 1)
        return filled, positions

    def _wait_for_records(self, ids: np.ndarray) -> bool:
        """Whether rows ``ids`` of a shuffled batch, without records, waited for the records
        of their shards that this process is building (or, in a forked worker, that its
        loader's process is writing for it).

        A shuffled batch gathers its rows one by one, and from the columns each row costs a
        cache miss per column: 0.45 M W1 rows/s on a node's first run, on the core the
        builders need, against ~2 M rows/s per builder thread and ~5 M from the records
        (bench/RESULTS.md). So from the second batch on, a shuffled batch waits for the
        builds of its shards in progress (every batch after it would wait for the same
        builds). Not the first batch (cold start: it does not wait for a build), not a
        contiguous run of rows in the process building them (natural order: it builds and
        reads their tiles, :meth:`_gather_tiles`), not on a node whose kernels must compile
        (the builds wait for that; batches keep the columns' NumPy twins meanwhile). A
        forked worker waits for the records its loader's process is writing into the store
        for it (ShardRecords.wait_saved), and maps them, in either order: on 2 cores, 2
        process workers gathering from the columns took the cores the builds needed (2 M W1
        rows, a node's first shuffled run: 1.6-2.9 s against 1.1 s without workers; in
        natural order, with the loader's process building a shard ahead, open_for_workers:
        1.72-1.98 s -> 1.30-1.48 s, at 5 M rows 4.45-4.63 s -> 3.11-3.68 s)."""
        if self._rm is None or self._firsts or len(ids) < 2 or not self._rm.records_coming() \
                or not warm.usable(kernels.copy_ranges):
            return False
        building = self._rm.building()
        if building and _contiguous(ids):  # natural order here: tiles (_gather_tiles)
            return False
        t0 = time.perf_counter()
        shards = np.unique(self.locate(ids)[0])
        waited = self._rm.wait_built(shards) if building else self._rm.wait_saved(shards)
        if waited:
            with self._lock:
                self.records_waits += 1
                self.records_wait_s += time.perf_counter() - t0
        return waited

    @property
    def opens_ahead(self) -> bool:
        """Whether :meth:`open_for_workers` may still open a shard."""
        return bool(self._local and self._stager is None and self._rm is not None and
                    self._rm.mode and len(self._opened_ahead) < self.manifest.num_shards)

    def open_for_workers(self, ids: Sequence[np.ndarray], wait: bool = True) -> None:
        """Open the shards of ``ids`` in this process for worker processes: called before
        they fork, each inherits the maps and checked records instead of opening them again
        (2 M W1 rows: ~130 ms per worker and epoch, mostly mapping and verifying stored
        records); called with every task after (``wait=False``: opened by a background
        thread, stoker.loader.read.open_shards.NextShard, while the consumer goes on handing
        out tasks and taking batches; 5 M W1 rows, a first natural run with 2 process
        workers: opens in the consumer's thread held it 0.12-0.45 s at each new shard,
        1.45 s of a 4.66 s epoch), this process builds and saves the records of the shards
        the workers reach, which they map once saved (a forked worker builds
        none under ``row_major="auto"``: N workers would hold N private copies); in natural
        order the shard after a task's last also opens, so that its records are built while
        the workers read this one's (they wait for them, :meth:`_wait_for_records`). Local
        shards with records only (a cached shard opened here would stay pinned against the
        cache's limit), and not while rounds are staged (the stager reads what opens).
        ``ids``: the tasks' id arrays (joined only while some shard is still to open).

        Before the first fork, a dataset of at most ``_OPEN_ALL`` shards whose records are
        all stored opens whole: a shard opened after the fork is opened by this process and
        again by each worker that reaches it, between batches (2 M W1 rows, 4 shards, natural
        order, 2 process workers, a fresh process: ~110 ms at each shard boundary; 2.9-3.3 M
        rows/s, 4.4-4.6 M with every shard opened before the fork). Shards open several at
        once (OpenShards.open_all)."""
        if not self.opens_ahead:
            return
        wanted = self._shards_of(np.concatenate(ids))
        if len(ids[-1]) and _contiguous(ids[-1]) and wanted[-1] + 1 < self.manifest.num_shards:
            wanted.append(wanted[-1] + 1)  # natural order: the workers' next shard builds too
        new = [s for s in wanted if s not in self._opened_ahead]
        if not self._opened_ahead and self.manifest.num_shards <= _OPEN_ALL and \
                all(self._shard_stored(s) for s in range(self.manifest.num_shards)):
            new = list(range(self.manifest.num_shards))
        if new:
            self._rm.for_workers = True
            self._opened_ahead.update(new)
        if not wait:
            self._next.open_soon(new)
            return
        self._shards.open_all(new, lambda index, exc: note(  # raised by its batch, in turn
            "open_ahead_failed", f"{type(exc).__name__}: {exc}"))

    def open_next(self, ids: Sequence[np.ndarray]) -> None:
        """Called with the tasks handed out to readers in this process (thread workers, the
        reader thread): in natural order, the shard after the last task's opens in the
        background before a batch reaches it (stoker.loader.read.open_shards.NextShard).
        Not while rounds are staged (the stager reads what opens)."""
        if self._stager is None:
            self._next(ids)

    def _shards_of(self, ids: np.ndarray) -> list[int]:
        """The distinct shards global ``ids`` fall in, ascending."""
        return distinct(np.searchsorted(self._starts, ids, side="right") - 1).tolist()

    def _open_shards_of(self, ids: np.ndarray) -> bool:
        """Open the shards of ``ids`` that are not open; whether there were any."""
        return self._shards.open_all(self._shards_of(ids))

    def _fetch_arrow(self, ids: np.ndarray, epoch: int, seed: int) -> dict[str, Any]:
        return arrow_batch(self.take(ids), ids, self.features, self.categoricals, self.image,
                           self.fingerprint, epoch, seed)

    def close(self) -> None:
        """Release every open shard (and its cache pin); idempotent."""
        self._next.close()
        handles = self._shards.detach()
        self._opened_ahead.clear()
        if self._rm is not None:
            self._rm.close()
        if self._stager is not None:
            self._stager.close()
        if self._files is not None:
            self._files.close()
        self._shards.release(handles)


def _shown(ids: np.ndarray) -> str:
    """The first ids of a batch, for messages."""
    return f"{ids[:8].tolist()}{'...' if len(ids) > 8 else ''}"


def _contiguous(ids: np.ndarray) -> bool:
    """Whether ``ids`` are consecutive ascending rows (natural order)."""
    return len(ids) > 0 and int(ids[-1]) - int(ids[0]) == len(ids) - 1 and \
        bool((np.diff(ids) == 1).all())
