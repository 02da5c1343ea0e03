"""Read samples of a stoker dataset by global id: memory-mapped shards, fused kernels.

A global sample id is the sample's index in the concatenation of the manifest's shards.
Uncompressed (memory-mapped, zero-copy) shards go through the fast path
(:mod:`stoker.loader.fastpath.plan`): Numba kernels gather the rows straight into reusable batch
buffers (:mod:`stoker.loader.fastpath.ring`). Otherwise (compressed shards, or ``features`` /
``categoricals`` the kernels cannot read) a batch groups its ids by shard, takes the rows from
each shard with pyarrow and restores the requested order with one more take; both paths
return equal batches.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa
import torch

from stoker.loader.fastpath.convert import stack_features, table_to_batch
from stoker.loader.errors import WorkerError
from stoker.loader.fastpath import kernels
from stoker.loader.fastpath import kernels_np
from stoker.loader.fallbacks import note
from stoker.loader.fastpath.plan import FastPlan, NotZeroCopy, ShardData
from stoker.loader.fastpath.images import ImageOptions, decode_into
from stoker.loader.jit import warmup
from stoker.loader.fastpath.record_table import RecordTable
from stoker.loader.fastpath.ring import BufferRing
from stoker.loader.order.epoch import OrderOptions
from stoker.loader.read.order_plan import record_stride
from stoker.loader.fastpath.shard_records import ShardRecords
from stoker.loader.read.staging import Stager
from stoker.manifest import (Manifest, ManifestError, ShardIntegrityError, StokerError,
                             redact_url, resolve_inside)

__all__ = ["ArrowSource", "ShardOpener", "check_column_names"]

logger = logging.getLogger(__name__)

# Opens shard `index` and yields a local path that stays valid inside the context.
ShardOpener = Callable[[int], AbstractContextManager[str]]



def check_column_names(manifest: Manifest, columns: Sequence[str] | None,
                       features: Sequence[str] | None,
                       categoricals: Sequence[str] | None) -> None:
    """Raise :class:`ManifestError` naming the argument and the first column the dataset
    does not have."""
    names = manifest.arrow_schema.names
    for what, given in (("columns", columns), ("features", features),
                        ("categoricals", categoricals)):
        unknown = [c for c in (given or ()) if c not in names]
        if unknown:
            raise ManifestError(f"{what}={list(given or ())!r}: no column named "
                                f"{unknown[0]!r} in this dataset; its columns are {names}.")

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
            logged once and memory is used instead.
    """

    kind = "stoker"

    def __init__(self, manifest: Manifest, *, columns: Sequence[str] | None = None,
                 features: Sequence[str] | None = None, opener: ShardOpener | None = None,
                 max_open: int = 256, categoricals: Sequence[str] | None = None,
                 fast: bool = True, ring_depth: int = 8, pin: bool = False,
                 image: ImageOptions | None = None, row_major: bool | str = "auto",
                 row_major_dir: str | None = None) -> None:
        check_column_names(manifest, columns, features, categoricals)
        names = manifest.arrow_schema.names
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
        wanted = list(columns) if columns is not None else list(names)
        self.columns = list(dict.fromkeys(wanted + self.features + self.categoricals))
        schema = manifest.arrow_schema
        self._check_categoricals(schema)
        self.image = image
        if image is not None:
            if image.column not in names:
                raise ManifestError(f"image column {image.column!r} is not in this dataset; "
                                    f"its columns are {names}.")
            t = schema.field(image.column).type
            if not (pa.types.is_binary(t) or pa.types.is_large_binary(t)):
                raise ValueError(f"ImageOptions.column={image.column!r} is {t}; it must be a "
                                 "binary column of encoded JPEG/PNG images.")
            if image.column not in self.columns:
                self.columns.append(image.column)
        self._plan = FastPlan(schema, self.columns, self.features, self.categoricals, image) \
            if fast and getattr(manifest, "kind", "arrow") == "arrow" \
            and FastPlan.supports(schema, self.features, self.categoricals) else None
        self._ring = BufferRing(ring_depth, pin)
        self._data: dict[int, ShardData | None] = {}
        self._opener = opener or self._local_opener
        self._open: OrderedDict[int, tuple[pa.Table, AbstractContextManager[str]]] = OrderedDict()
        self._max_open = max_open
        self._lock = threading.Condition()
        self._opening: set[int] = set()  # shards being opened (pinned) by some thread now
        self.opened_shards: set[int] = set()
        self._force_stage = row_major == "staged"
        if self._force_stage:
            row_major = "auto"
        self._rm = ShardRecords(self._plan, manifest, row_major, row_major_dir, self._lock,
                                lambda index, data: self._data.get(index) is data) \
            if self._plan is not None else None
        self._stager: Stager | None = None
        self._records_mode = self._rm.mode if self._rm is not None else 0  # bytes; -1: any
        self._warm = (warmup.start(self._plan, schema, bool(self._rm and self._rm.mode)),
                      self._plan, schema, bool(self._rm and self._rm.mode)) \
            if self._plan is not None else None

    def stage(self, options: OrderOptions, rank: int, world_size: int) -> bool:
        """Read shuffled batches through staging rounds (:mod:`stoker.loader.read.staging`) for
        this rank's order instead of per-shard records; whether the fast path allows it
        (natural order reads consecutive rows and needs no staging)."""
        if self._plan is None or not options.shuffle or not self._records_mode \
                or (not self._force_stage and self._records_fit()):
            return False
        if self._stager is not None:
            self._stager.close()
        self._stager = Stager(self._plan, options, rank, world_size, self.shard_rows,
                              self.fingerprint, self._starts,
                              lambda s, *rows: [(self._data_of(s), *rows)],
                              stage_ahead=self._opener == self._local_opener)
        self._rm = None
        return True

    def _records_fit(self) -> bool:
        """Whether every shard's records fit the records budget (``row_major=True``: always):
        then per-shard records, built once per node and mapped, serve shuffled batches
        fastest; beyond it, rounds are staged (a bounded working set at any size)."""
        if self._records_mode < 0:
            return True
        stride = record_stride(self.manifest, self.columns, self.features, self.categoricals,
                               self.image)
        # half the budget: records are reserved per open shard, and a dataset whose records
        # only just fit was measured to keep part of its shards on the column path (5 M W1
        # rows, 1.96 GB of records, 2 GiB budget: 1.1 GB built, 0.19 M rows/s)
        return int(self.shard_rows.sum()) * stride <= self._records_mode // 2

    @property
    def stager(self) -> Stager | None:
        """The staging of shuffled rounds, when :meth:`stage` enabled it."""
        return self._stager

    def _check_categoricals(self, schema: pa.Schema) -> None:
        for name in self.categoricals:
            t = schema.field(name).type
            if not (pa.types.is_integer(t) or pa.types.is_dictionary(t)):
                raise ValueError(f"categoricals={self.categoricals!r}: column {name!r} is {t}; "
                                 "categoricals must be integer or dictionary columns (pass "
                                 "float columns in features= instead).")

    @property
    def fast(self) -> bool:
        """Whether batches can use the fast path (shards are checked as they are opened)."""
        return self._plan is not None

    @property
    def ring(self) -> BufferRing:
        """The reusable batch buffers of the fast path."""
        return self._ring

    # -- shard access ---------------------------------------------------------------------
    def _local_opener(self, index: int) -> AbstractContextManager[str]:
        location = self.manifest.shard_location(index)
        if "://" in location and not location.startswith("file://"):
            raise ManifestError(f"{redact_url(location)}: remote shards need a cache; pass "
                                "cache_dir=... to the DataLoader.")
        root = (self.manifest.root or ".").removeprefix("file://")
        return nullcontext(resolve_inside(root, self.manifest.shards[index].path,
                                          f"shards[{index}].path"))

    def _table(self, index: int) -> pa.Table:
        """Shard ``index`` as a table, opening (and pinning) it if needed.

        Open shards plus shards being opened never exceed ``max_open``: the oldest open shard
        is closed (its cache pin released) *before* a new one is pinned, and concurrent
        openers of the same shard wait for the first, so the pins a cache sees stay bounded
        however many worker threads read.
        """
        closing = []
        with self._lock:
            while True:
                entry = self._open.get(index)
                if entry is not None:
                    self._open.move_to_end(index)
                    return entry[0]
                if index not in self._opening:
                    if len(self._open) + len(self._opening) < self._max_open:
                        break
                    if self._open:
                        closing.append(self._evict_oldest_locked())
                        continue
                self._lock.wait()
            self._opening.add(index)
        try:
            for h in closing:
                h.__exit__(None, None, None)
            table, data, batches, handle = self._open_shard(index)
        except BaseException:
            with self._lock:
                self._opening.discard(index)
                self._lock.notify_all()
            raise
        with self._lock:
            self._opening.discard(index)
            self.opened_shards.add(index)
            self._open[index] = (table, handle)
            self._data[index] = data
            self._lock.notify_all()
        if data is not None and self._stager is not None:
            self._stager.opened(batches)
        elif data is not None and self._rm is not None:
            self._rm.opened(index, data, batches)
        return table

    def _evict_oldest_locked(self) -> AbstractContextManager[str]:
        """Drop the least recently used open shard; returns its handle to close unlocked."""
        evicted, (_, handle) = self._open.popitem(last=False)
        self._data.pop(evicted, None)
        if self._rm is not None:
            self._rm.dropped(evicted)
        self._lock.notify_all()
        return handle

    def _open_shard(self, index: int) -> tuple[pa.Table, Any, list[pa.RecordBatch], Any]:
        # The opener's context (a cache pin) stays entered while the shard is open here.
        handle = self._opener(index)
        path = handle.__enter__()
        try:
            source = pa.memory_map(path, "r")
            arena = source.read_buffer(source.size())  # zero-copy view of the whole file
            # one call for all record batches: a call per batch gives the GIL away hundreds of
            # times, each handoff waiting on a busy thread (0.17 s for W1's 296 during warm-up)
            full = pa.ipc.open_file(arena).read_all()
            batches = full.to_batches()
            self._check_batches(index, batches)
            table = full.select(self.columns)
            data = self._shard_data(batches, arena)
            if data is None and self.manifest.compression != "none":
                table = table.combine_chunks()  # decompress once, not once per take
        except (OSError, pa.ArrowException) as exc:  # an unreadable file: name the shard
            handle.__exit__(None, None, None)
            raise WorkerError(f"opening {self._describe(index)} failed: {type(exc).__name__}: "
                              f"{exc}; run `stoker verify` on the dataset.") from exc
        except BaseException:
            handle.__exit__(None, None, None)
            raise
        return table, data, batches, handle

    def _check_batches(self, index: int, batches: list[pa.RecordBatch]) -> None:
        """The shard's record batches must hold the rows the manifest lists, batch by batch.

        Global ids are located with the manifest's row counts and then read by the kernels
        through raw pointers; a file whose batches disagree (stale, swapped, a manifest
        rewritten with a recomputed fingerprint) would send row indices past the end of a
        batch's buffers. Checked once per open, so every later read is in range by
        construction (FastPlan.groups checks each batch's rows against it too).
        """
        actual = [b.num_rows for b in batches if b.num_rows]
        listed = [r for r in self.manifest.shards[index].batch_rows if r]
        if actual != listed:
            info = self.manifest.shards[index]
            raise ShardIntegrityError(
                f"{self._describe(index)} holds record batches of {_runs(actual)} rows "
                f"({sum(actual)} in all), the manifest lists {_runs(listed)} ({info.rows} in "
                "all): the file and the manifest disagree. Run `stoker verify` and restore the "
                "shard, or re-create the dataset with `stoker shard`.", shard=info.path)

    # -- row-major records (stoker.loader.fastpath.shard_records) --------------------------------------
    @property
    def _records(self) -> RecordTable | None:
        return self._rm.table if self._rm is not None else None

    def wait_row_major(self) -> None:
        """Block until every row-major record started so far is built and saved (tests,
        benchmarks)."""
        if self._rm is not None:
            self._rm.wait()

    @property
    def row_major_bytes(self) -> int:
        """Bytes reserved by the row-major records of the open shards."""
        return self._rm.nbytes if self._rm is not None else 0

    def _shard_data(self, batches: list[pa.RecordBatch], arena: pa.Buffer) -> ShardData | None:
        """Kernel inputs for a shard, or ``None`` when it is not zero-copy (e.g. compressed)."""
        if self._plan is None or not batches:
            return None
        try:
            return ShardData(batches, arena, self._plan.kernel_columns)
        except NotZeroCopy:
            return None

    def _data_of(self, index: int) -> ShardData:
        self._table(index)
        data = self._data.get(index)
        if data is None:
            raise NotZeroCopy(f"shard {index} is not zero-copy")
        return data

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
        ids = np.asarray(ids, dtype=np.int64)
        if self._plan is not None and len(ids):
            slot = self._ring.acquire()
            try:
                twins = not warmup.ready(*self._warm)  # the kernels are still compiling:
                try:  # their NumPy twins write the same bytes now, from the same shards
                    filled, groups, rest = self._gather_twins(ids, slot) if twins \
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
                    batch = self._plan.run(groups, len(ids), slot,
                                           lambda cols: table_to_batch(self.take(ids, cols)),
                                           (ids, self.fingerprint, seed, epoch), filled, rest,
                                           kernels_np if twins else kernels)
                    if twins:  # the warm-ups held back for the first batch compile now
                        warmup.served()
                    return batch
            finally:
                self._ring.release(slot)
        return self._fetch_arrow(ids, epoch, seed)

    def _gather_twins(self, ids: np.ndarray, slot: Any) -> tuple[dict[str, np.ndarray],
                                                                  list[Any], list[Any]]:
        """:meth:`_gather_records` while the kernels compile: every output from the columns
        (records are read by a kernel), counted as a ``"compiling"`` fallback."""
        assert self._plan is not None  # noqa: S101
        note("compiling", f"batch of samples {_shown(ids)}")
        return {}, self._plan.groups(ids, self._starts, self._data_of), []

    def _gather_records(self, ids: np.ndarray, slot: Any, epoch: int = 0,
                        seed: int = 0) -> tuple[dict[str, np.ndarray], list[Any], list[Any]]:
        """Outputs written from row-major records, then the groups the column kernels need:
        ``(filled, groups of every row for the other outputs, groups of the rows without
        records for the filled outputs)`` (see :meth:`FastPlan.run`)."""
        assert self._plan is not None  # noqa: S101
        plan = self._plan
        if self._stager is not None:
            filled, positions = self._stager.gather(ids, slot, epoch, seed)
            lists = {f.name for f in self._stager.fields if f.kind == "list"}
        else:
            filled, positions = self._gather_once(ids, slot)
        if self._stager is None and len(positions) and self._open_shards_of(ids[positions]):
            filled, positions = self._gather_once(ids, slot)  # opened shards map stored records
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

    def _gather_once(self, ids: np.ndarray, slot: Any) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Record-served outputs of ``ids`` and the batch positions of rows without records."""
        table = self._records
        if table is None or not len(table):
            return {}, np.arange(len(ids))
        filled, positions, touched = table.gather(ids, self._starts, slot)
        if len(touched):
            self._touch(touched)
        return filled, positions

    def _open_shards_of(self, ids: np.ndarray) -> bool:
        """Open the shards of ``ids`` that are not open; whether there were any."""
        shards = np.unique(np.searchsorted(self._starts, ids, side="right") - 1).tolist()
        closed = [s for s in shards if s not in self._open]
        for s in closed:
            self._table(s)
        return bool(closed)

    def _touch(self, shards: np.ndarray) -> None:
        """Mark open ``shards`` as just used (the records path reads them without _table)."""
        with self._lock:
            for s in shards.tolist():
                if s in self._open:
                    self._open.move_to_end(s)

    def _fetch_arrow(self, ids: np.ndarray, epoch: int, seed: int) -> dict[str, Any]:
        table = self.take(ids)
        batch: dict[str, Any] = {}
        if self.image is not None:
            images = self._images_arrow(table.column(self.image.column), ids, epoch, seed)
        if self.features:
            batch["features"] = stack_features(table, self.features)
            table = table.drop_columns(self.features)
        if self.categoricals:
            batch["categoricals"] = _stack_ints(table, self.categoricals)
            table = table.drop_columns(self.categoricals)
        converted = table_to_batch(table)
        if self.image is not None:
            converted[self.image.column] = images
        batch.update(converted)
        return batch

    def _images_arrow(self, column: pa.ChunkedArray, ids: np.ndarray, epoch: int,
                      seed: int) -> torch.Tensor:
        """Decode a taken binary column (the pyarrow path's image output)."""
        opts = self.image
        assert opts is not None  # noqa: S101
        blobs = [b or b"" for b in column.to_pylist()]
        offsets = np.concatenate([[0], np.cumsum([len(b) for b in blobs])]).astype(np.int64)
        data = np.frombuffer(b"".join(blobs), dtype=np.uint8)
        out = np.empty((len(ids), *opts.size, 3), dtype=opts.dtype)
        decode_into(opts, offsets, data, ids, out, self.fingerprint, seed, epoch)
        return torch.from_numpy(out)

    def close(self) -> None:
        """Release every open shard (and its cache pin); idempotent."""
        with self._lock:
            entries = list(self._open.values())
            self._open.clear()
            self._data.clear()
        if self._rm is not None:
            self._rm.close()
        if self._stager is not None:
            self._stager.close()
        for _, handle in entries:
            handle.__exit__(None, None, None)


def _runs(rows: list[int]) -> str:
    """Row counts as ``16 x 3 + 10`` (messages)."""
    out: list[list[int]] = []
    for r in rows:
        if out and out[-1][0] == r:
            out[-1][1] += 1
        else:
            out.append([r, 1])
    return " + ".join(f"{r} x {n}" if n > 1 else str(r) for r, n in out) or "no"


def _shown(ids: np.ndarray) -> str:
    """The first ids of a batch, for messages."""
    return f"{ids[:8].tolist()}{'...' if len(ids) > 8 else ''}"


def _stack_ints(table: pa.Table, columns: Sequence[str]) -> torch.Tensor:
    """Integer / dictionary columns -> int64 ``[B, C]`` (dictionary -> codes, nulls -> 0)."""
    out = np.empty((table.num_rows, len(columns)), dtype=np.int64)
    for j, name in enumerate(columns):
        out[:, j] = table_to_batch(table.select([name]))[name].numpy()
    return torch.from_numpy(out)
