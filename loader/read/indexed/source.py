"""Read an index dataset (``parquet-index`` / ``webdataset-index``) in place, by global id.

Same ids, order, resume and audit as a native dataset: only how a shard's rows are read
differs. A Parquet shard is one file whose record batches are its row groups, so a batch reads
just the row groups its ids fall in (a bounded cache keeps recent ones); a WebDataset shard is
one tar whose samples are read by byte offset. Before a file is first read, its size and
xxh3-128 are checked against the manifest (for Parquet indexed with row-group digests: its
footer, and each row group before its rows are decoded): a file changed after indexing is a
:class:`~stoker.manifest.ShardIntegrityError` naming it, never wrong data.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from stoker.loader.read.arrow import ArrowSource, Digest
from stoker.loader.fallbacks import note
from stoker.loader.jit.ahead import Ahead
from stoker.loader.fastpath import warm
from stoker.loader.fastpath.advise import shards_fit_memory
from stoker.loader.fastpath.plan import FastPlan
from stoker.loader.fastpath.ring import BufferRing
from stoker.loader.fastpath.record_store import RecordStore
from stoker.loader.read.indexed.group_records import GroupRecords
from stoker.loader.read.indexed.hashed_files import HashedFiles
from stoker.loader.read.indexed.natural import NaturalGroups
from stoker.loader.read.indexed.row_groups import RowGroups, all_records
from stoker.loader.read.indexed.span_file import SpanFile, read_span
from stoker.loader.order.options import OrderOptions
from stoker.loader.read.staging import Stager
from stoker.manifest import (Manifest, ManifestError, ShardIntegrityError, hash_file, hash_range,
                             redact_url)
from stoker.manifest.webdataset_columns import SampleFormatError, parse_members, samples_to_table

__all__ = ["IndexSource"]

_CACHE_BYTES = 512 << 20
_FOOTERS = 256  # Parquet footers kept (each can be tens of KB: columns x row groups)
# row groups' bytes kept from their check until their decode reads them (span_file), unless
# staged (then one per partition cursor: see stage): the group checked ahead and the one
# being read, with room for a second reader (natural order)
_SPANS = 4
_SPAN_BYTES = 256 << 20  # a larger row group is hashed in pieces and decoded from the file


class IndexSource(ArrowSource):
    """Batches of an index dataset (see module docstring); arguments as :class:`ArrowSource`.

    Args:
        cache_bytes: Arrow bytes of decoded Parquet row groups kept for reuse; while row
            groups are checked (a node's first run), at most as many bytes again of their
            file bytes, read by a check ahead of their decode.
        verify: ``"hash"`` (default): size and xxh3-128 of each file before its first read,
            or, for Parquet indexed with row-group digests, of its footer then and of each
            row group before its first decode (the very bytes the decode then reads:
            stoker.loader.read.indexed.span_file); not again in a later process while the
            file's ``stat`` is unchanged since this node checked it
            (stoker.loader.read.indexed.hashed_files);
            ``"size"``: size only, for very large files on slow storage
            (a same-size edit then goes unnoticed; ``stoker verify`` still checks hashes).
    """

    def __init__(self, manifest: Manifest, *, cache_bytes: int = _CACHE_BYTES,
                 verify: str = "hash", **kwargs: Any) -> None:
        if verify not in ("hash", "size"):
            raise ValueError(f"verify={verify!r} is not supported; use 'hash' or 'size'.")
        if manifest.kind not in ("parquet-index", "webdataset-index"):
            raise ManifestError(f"IndexSource reads index datasets; this one is {manifest.kind!r}.")
        root = manifest.root or ""
        if "://" in root and not root.startswith("file://"):
            raise ManifestError(f"{redact_url(root)}: index datasets are read in place and must "
                                "be local; convert remote data with `stoker shard` instead.")
        kwargs["fast"] = False
        where = kwargs.get("row_major_dir") if kwargs.get("row_major", "auto") is not False \
            else None
        super().__init__(manifest, **kwargs)
        self._records_dir: str | None = where  # staged groups' records kept on the node
        self._schema = manifest.arrow_schema
        self._verified: set[int] = set()
        # files whose row groups are checked as they are read (:meth:`_check_group`): the
        # ``stat`` when their footer was checked
        self._unchecked: dict[int, os.stat_result] = {}
        self._checked_groups: set[tuple[int, int]] = set()
        self._spans: OrderedDict[tuple[int, int], tuple[int, np.ndarray]] = OrderedDict()
        self._spans_kept = _SPANS
        self._span_buffers = BufferRing(_SPANS + 2)
        self._ahead = Ahead("stoker-check")  # the next row group, checked ahead
        self._verify = verify
        # files this node hashed before and that are unchanged since (stat) are not hashed
        self._hashed = HashedFiles(where) if where else None
        self._verify_lock = threading.Lock()
        self._groups: OrderedDict[tuple[int, int], pa.Table] = OrderedDict()
        self._group_bytes = 0
        self._cache_bytes = cache_bytes
        # the footers of the files read last, parsed once: a row group read then opens its
        # file without parsing it (4 ms -> 0.1 ms for W1's 77-group file; an epoch reads
        # ~every group once, a file's groups in a row); bounded like the open shards
        self._footers: OrderedDict[int, pq.FileMetaData] = OrderedDict()
        self._row_groups: RowGroups | None = None  # decoded groups of staged rounds
        self._natural: NaturalGroups | None = None  # decoded groups' records, natural order

    def open_next(self, ids: Sequence[np.ndarray]) -> None:
        """Nothing: its files are not opened as Arrow shards; the next row group is
        checked ahead by a thread of its own (``stoker-check``)."""

    # -- integrity -----------------------------------------------------------------------
    def _path(self, index: int) -> str:
        return self.manifest.shard_location(index).removeprefix("file://")

    def verify(self, index: int) -> str:
        """Check shard ``index``'s size and content once; return its local path.

        A Parquet file indexed with ``extra.digests`` has its footer checked here and each
        row group just before its first decode (:meth:`_check_group`): a node's first run
        then reads each byte once, where hashing the whole file first read it twice (a 9.3 GB
        file past memory: 8 s of a 32 s epoch). Other files are hashed whole here."""
        path = self._path(index)
        if index in self._verified:
            return path
        with self._verify_lock:
            if index in self._verified:
                return path
            info = self.manifest.shards[index]
            try:
                st = os.stat(path)
            except OSError as exc:
                raise ShardIntegrityError(f"{path}: indexed file is missing or unreadable "
                                          f"({exc.strerror}); restore it or run `stoker index` "
                                          "again.", shard=info.path) from exc
            size, hashed = st.st_size, self._hashed
            spans = info.extra.get("digests") if self.manifest.kind == "parquet-index" else None
            if self._verify == "size" or (size == info.bytes and hashed is not None and
                                          hashed.known(path, info.xxh3_128, st)):
                digest = info.xxh3_128
            elif spans is not None and size == info.bytes:
                self._check_span(index, spans["footer"], "its footer", st)
                self._unchecked[index] = st  # its row groups: as they are first read
                digest = info.xxh3_128
            else:
                digest = hash_file(path)[0] if size == info.bytes else None
                if digest == info.xxh3_128 and hashed is not None:
                    hashed.remember(path, digest, st)
            if size != info.bytes or digest != info.xxh3_128:
                what = f"size {size} bytes, indexed {info.bytes}" if size != info.bytes else \
                    f"xxh3-128 {digest}, indexed {info.xxh3_128}"
                raise ShardIntegrityError(
                    f"{path}: file changed after it was indexed ({what}); restore the original "
                    "or run `stoker index --overwrite` again (the dataset's fingerprint, and so "
                    "its order, will change).", shard=info.path)
            self._verified.add(index)
        return path

    def _check_group(self, index: int, group: int) -> None:
        """Row group ``group`` of file ``index`` holds the bytes indexed (once per process;
        not again in a later one while the file's ``stat`` is unchanged, as for whole
        files). The next group of the file, which is decoded next (ahead of the stager's
        cursors), is checked meanwhile in a background thread: a check is a disk read, and
        done in turn with each decode it left the decode waiting (a 9.3 GB file past memory,
        one run each: 28-31 s an epoch checked in turn, 24-26 s unchecked)."""
        st = self._unchecked.get(index)
        if st is None:
            return
        if group + 1 < len(self.manifest.shards[index].batch_rows) and \
                (index, group + 1) not in self._checked_groups:
            self._ahead.start((index, group + 1),
                              lambda: self._check_one(index, group + 1, st))
        self._ahead.wait((index, group))  # checked ahead: its error is this read's
        if (index, group) not in self._checked_groups:
            self._check_one(index, group, st)

    def _check_one(self, index: int, group: int, st: os.stat_result) -> None:
        span = self.manifest.shards[index].extra["digests"]["row_groups"][group]
        read = self._check_span(index, span, f"row group {group}", st,
                                keep=span[1] - span[0] <= _SPAN_BYTES)
        with self._verify_lock:
            if read is not None:  # decoded from (stoker.loader.read.indexed.span_file)
                self._spans[(index, group)] = (span[0], read)
                while len(self._spans) > self._spans_kept or len(self._spans) > 1 and \
                        sum(len(b) for _, b in self._spans.values()) > self._cache_bytes:
                    self._spans.popitem(last=False)  # its decode reads the file
            self._checked_groups.add((index, group))

    def _check_span(self, index: int, span: list[Any], what: str, st: os.stat_result,
                    keep: bool = False) -> np.ndarray | None:
        """``span`` = ``[start, end, xxh3-128]`` of file ``index`` as indexed, or
        :class:`ShardIntegrityError` naming ``what`` and the bytes. ``keep``: return the
        bytes hashed (``None`` when this node hashed them before and they were not read)."""
        path, (lo, hi, want) = self._path(index), span
        hashed = self._hashed
        if hashed is not None and hashed.known(path, want, st):
            return None
        fd = os.open(path, os.O_RDONLY)
        try:
            read = read_span(fd, lo, hi, self._span_buffers) if keep else None
            got = hash_range(fd, lo, hi) if read is None else xxhash.xxh3_128_hexdigest(read)
        finally:
            os.close(fd)
        if got != want:
            raise ShardIntegrityError(
                f"{path}: file changed after it was indexed (xxh3-128 {got} of {what}, bytes "
                f"[{lo}, {hi}), indexed {want}); restore the original or run `stoker index "
                "--overwrite` again (the dataset's fingerprint, and so its order, will "
                "change).", shard=self.manifest.shards[index].path)
        if hashed is not None:
            hashed.remember(path, want, st)
        return read

    # -- staging (stoker.loader.read.indexed.row_groups) ------------------------------------
    def stage(self, options: OrderOptions, rank: int, world_size: int) -> bool:
        """Serve shuffled batches from staged rounds when every output is a record (fixed
        width or list columns of indexed Parquet); decoded row groups are kept within
        ``cache_bytes``, which the loader sizes to the order's working set."""
        if self._stager is not None:
            self._stager.close()
            self._stager = None
        if self._row_groups is not None:
            self._row_groups.close()
            self._row_groups = None
        if self._natural is not None:
            self._natural.close()
            self._natural = None
        if self.manifest.kind != "parquet-index" or self.image \
                or not FastPlan.supports(self._schema, self.features, self.categoricals):
            return False
        plan = FastPlan(self._schema, self.columns, self.features, self.categoricals)
        if not all_records(plan):
            return False
        if options.shuffle:  # natural order loads it once it decodes (NaturalGroups)
            warm.prime_columns_to_records()
        # staged, a group's read checks the next group of its file, which its cursor reads
        # after ~rows-per-group / K rounds: its bytes wait that long, one group per cursor,
        # within the decoded groups' budget (20 M W1 rows in a 6 GiB cgroup, a node's first
        # run, 12 cursors: 0.85-0.95 M rows/s keeping 4, 1.02-1.07 M keeping 16: the others
        # were read again)
        kept = max(_SPANS, -(-options.partitions // world_size) + 2) if options.shuffle \
            else _SPANS
        if kept != self._spans_kept:
            self._spans_kept, self._span_buffers = kept, BufferRing(kept + 2)
        if not options.shuffle:
            self._natural = NaturalGroups(plan, self._verified_group, self._cache_bytes,
                                          self._group_records(),
                                          int(self.shard_rows.sum()) // world_size)
            return False
        groups = RowGroups(self._verified_group,
                           lambda f: np.asarray(self.manifest.shards[f].batch_rows),
                           plan.kernel_columns, lambda b: self._stager.opened(b),  # type: ignore[union-attr]
                           self._cache_bytes, lambda: self._stager.layout,  # type: ignore[union-attr]
                           self._group_records())
        self._staged_plan, self._row_groups = plan, groups
        self._stager = Stager(plan, options, rank, world_size, self.shard_rows,
                              self.fingerprint, self._starts, groups.runs)
        return True

    def wait_row_major(self) -> None:
        """As :meth:`ArrowSource.wait_row_major`, and the saves of row groups' records."""
        super().wait_row_major()
        for groups in (self._row_groups, self._natural):
            if groups is not None and groups.stored is not None:
                groups.stored.wait()

    def _group_records(self) -> GroupRecords | None:
        """The node's stored records of row groups (None: records kept nowhere)."""
        if self._records_dir is None:
            return None
        try:
            store = RecordStore(self._records_dir)
        except OSError as exc:
            note("records_not_saved", f"{self._records_dir} is not usable ({exc}): indexed "
                                      "row groups are decoded on every run")
            return None
        return GroupRecords(store, lambda f: self.manifest.shards[f].xxh3_128,
                            self._verified_group,
                            not shards_fit_memory(int(self.manifest.shard_bytes.sum())))

    def _verified_group(self, index: int, group: int,
                        columns: list[str] | None = None) -> pa.Table:
        self.verify(index)
        self.opened_shards.add(index)
        return self._read_group(index, group, columns)

    def fetch_digested(self, ids: np.ndarray, epoch: int, seed: int,
                       digest: Digest | None) -> tuple[dict[str, Any], Any]:
        """As :meth:`ArrowSource.fetch_digested`; from staged rounds when :meth:`stage`
        enabled them."""
        ids = np.asarray(ids, dtype=np.int64)
        stager, natural = self._stager, self._natural
        if natural is not None and len(ids) and bool((np.diff(ids) == 1).all()):  # consecutive
            served = self._fetch_natural(natural, ids, digest)
            if served is not None:
                return served
        if stager is not None and len(ids):
            slot = self._ring.acquire()
            try:
                filled, missing = stager.gather(ids, slot, epoch, seed)
                plan = self._staged_plan
                if not len(missing) and all(o.name in filled for o in plan.outputs):
                    arrays: dict[str, np.ndarray] = {}
                    batch = plan.run([], len(ids), slot, lambda cols: {}, None, filled,
                                     arrays=arrays)
                    return batch, None if digest is None else digest(batch, arrays)
                note("index_unstaged", f"a list column's width differs between row groups; "
                                       f"batch of samples {ids[:4].tolist()}... read by pyarrow")
            finally:
                self._ring.release(slot)
        return super().fetch_digested(ids, epoch, seed, digest)

    def _fetch_natural(self, natural: NaturalGroups, ids: np.ndarray,
                       digest: Digest | None) -> tuple[dict[str, Any], Any] | None:
        """A batch of consecutive rows (natural order) copied out of its row groups'
        records; ``None`` when a group's columns are not plain (the caller reads it with
        pyarrow)."""
        starts = self._starts
        if ids[0] < 0 or ids[-1] >= starts[-1]:  # the pyarrow path names the bad ids
            return None
        file = int(np.searchsorted(starts, ids[0], side="right") - 1)
        if ids[-1] >= starts[file + 1]:  # across two files: rare, read with pyarrow
            return None
        slot = self._ring.acquire()
        try:
            filled = natural.gather(file, self.manifest.shards[file].batch_rows,
                                    int(ids[0] - starts[file]), len(ids), slot)
            if filled is None:
                return None
            arrays: dict[str, np.ndarray] = {}
            batch = natural.plan.run([], len(ids), slot, lambda cols: {}, None, filled,
                                     arrays=arrays)
            return batch, None if digest is None else digest(batch, arrays)
        finally:
            self._ring.release(slot)

    # -- reading --------------------------------------------------------------------------
    def _empty(self, columns: list[str]) -> pa.Table:
        return self._schema_of(columns).empty_table()

    def _piece(self, index: int, rows: np.ndarray, columns: list[str]) -> pa.Table:
        self.verify(index)
        self.opened_shards.add(index)
        return self._rows(index, rows, self._schema_of(columns))

    def _describe(self, index: int) -> str:
        return f"indexed file {self._path(index)}"

    def _schema_of(self, columns: list[str]) -> pa.Schema:
        return pa.schema([self._schema.field(c) for c in columns])

    def _rows(self, index: int, rows: np.ndarray, schema: pa.Schema) -> pa.Table:
        if self.manifest.kind == "webdataset-index":
            return self._tar_rows(index, rows, schema)
        info = self.manifest.shards[index]
        starts = np.concatenate([[0], np.cumsum(info.batch_rows)]).astype(np.int64)
        group = np.searchsorted(starts, rows, side="right") - 1
        needed = np.unique(group)
        tables = [self._row_group(index, int(g)) for g in needed]
        base = np.zeros(len(starts), dtype=np.int64)
        base[needed] = np.concatenate([[0], np.cumsum([t.num_rows for t in tables])])[:-1]
        local = base[group] + rows - starts[group]
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        return table.select(schema.names).take(pa.array(local))

    def _row_group(self, index: int, group: int) -> pa.Table:
        key = (index, group)
        with self._lock:
            hit = self._groups.get(key)
            if hit is not None:
                self._groups.move_to_end(key)
                return hit
        table = self._read_group(index, group)
        with self._lock:
            if key not in self._groups:
                self._groups[key] = table
                self._group_bytes += table.nbytes
            while self._group_bytes > self._cache_bytes and len(self._groups) > 1:
                _, old = self._groups.popitem(last=False)
                self._group_bytes -= old.nbytes
        return table

    def _read_group(self, index: int, group: int, columns: list[str] | None = None) -> pa.Table:
        """One row group with ``columns`` (default: those this source reads), cast to the
        manifest's types."""
        self._check_group(index, group)
        info = self.manifest.shards[index]
        values = info.extra.get("partitions", [])
        fields = list(self._schema)
        cut = len(fields) - len(values)  # hive partition columns come after the file columns
        wanted = set(self.columns if columns is None else columns)
        file_fields = [f for f in fields[:cut] if f.name in wanted]
        hive = [(f, v) for f, v in zip(fields[cut:], values) if f.name in wanted]
        with self._verify_lock:
            footer = self._footers.get(index)
            span = self._spans.pop((index, group), None)
        source: Any = self._path(index)
        if span is not None:  # the bytes the check read: decoded without reading them again
            source = pa.PythonFile(SpanFile(source, self.manifest.shards[index].bytes, *span),
                                   mode="r")
        parquet = pq.ParquetFile(source, metadata=footer)
        if footer is None:
            with self._verify_lock:
                self._footers[index] = parquet.metadata
                while len(self._footers) > _FOOTERS:
                    self._footers.popitem(last=False)
        table = parquet.read_row_group(group, columns=[f.name for f in file_fields])
        if table.num_rows != info.batch_rows[group]:
            raise ShardIntegrityError(f"{self._path(index)}: row group {group} has "
                                      f"{table.num_rows} rows, indexed {info.batch_rows[group]}; "
                                      "the file changed. Run `stoker index` again.",
                                      shard=info.path)
        arrays = [table.column(f.name) for f in file_fields]
        arrays = [a if a.type == f.type else a.cast(f.type) for a, f in zip(arrays, file_fields)]
        n = table.num_rows
        for field, value in hive:
            arrays.append(pa.nulls(n, field.type) if value is None
                          else pa.repeat(pa.scalar(value, field.type), n))
        schema = pa.schema(file_fields + [f for f, _ in hive])
        return pa.Table.from_arrays(arrays, schema=schema).combine_chunks()

    def _tar_rows(self, index: int, rows: np.ndarray, schema: pa.Schema) -> pa.Table:
        offsets = self.manifest.shards[index].extra["offsets"]
        path = self._path(index)
        samples = []
        fd = os.open(path, os.O_RDONLY)
        try:
            for r in rows.tolist():
                lo, hi = offsets[r], offsets[r + 1]
                data = os.pread(fd, hi - lo, lo)
                if len(data) != hi - lo:
                    raise ShardIntegrityError(f"{path}: short read at byte {lo}; the file "
                                              "changed after indexing. Run `stoker index` again.",
                                              shard=self.manifest.shards[index].path)
                samples.append(parse_members(data, path))
            return samples_to_table(path, samples, schema)
        except SampleFormatError as exc:
            # the file's hash matched the index, so only a bad index gets here
            raise ShardIntegrityError(str(exc), shard=self.manifest.shards[index].path) from exc
        finally:
            os.close(fd)

    def close(self) -> None:
        """Drop cached row groups; idempotent."""
        with self._lock:
            self._groups.clear()
            self._group_bytes = 0
        if self._row_groups is not None:
            self._row_groups.close()
        if self._natural is not None:
            self._natural.close()
        self._ahead.close()
        super().close()
