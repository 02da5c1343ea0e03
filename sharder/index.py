"""``stoker index``: a manifest over existing Parquet files or WebDataset tars, read in place.

Nothing is rewritten. The manifest is written next to the data (by default into SRC, or a
directory above it), because shard paths must stay inside the dataset directory: every
indexed file must lie under DST.

- ``parquet-index``: one shard per file, ``batch_rows`` = its row-group row counts (the loader
  reads only the row groups a batch needs). Types are unified as ``stoker shard`` does
  (exact match, nullability OR-ed; the loader casts); hive ``key=value`` directories become
  columns, their values kept in ``extra.partitions``.
- ``webdataset-index``: one shard per uncompressed ``.tar``; ``extra.offsets`` holds N+1 byte
  offsets: sample ``i`` is the members in bytes ``[offsets[i], offsets[i+1])``. Columns follow
  :mod:`stoker.sharder.sources.webdataset`. Compressed tars cannot be addressed by offset: shard
  them with ``stoker shard`` instead.

Every file's size and xxh3-128 are recorded (``shards[]`` and ``provenance.sources``), and
for Parquet, in the same read, the xxh3-128 of its footer and of each row group's bytes
(``extra.digests``): the loader checks the footer before it reads a file and each row group
before it decodes it, so a file changed after indexing is an error naming it (and the row
group), and a node's first run reads each byte once instead of hashing the whole file
first. (The modification time is not recorded: it differs between copies of the same bytes
and would change the fingerprint, hence the order, of identical data.)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from stoker.manifest import (MANIFEST_NAME, Manifest, ShardInfo, hash_file, hash_file_ranges,
                             stoker_version)
from stoker.sharder.errors import SharderError
from stoker.sharder.executor import Executor, LocalExecutor
from stoker.sharder.inputs import InputFile, _partitions, detect_format
from stoker.sharder.options import ShardOptions
from stoker.sharder.plan import make_plan
from stoker.sharder.sources.tar_layout import tar_layout
from stoker.sharder.sources.webdataset import tar_schema

__all__ = ["index"]


def _walk(root: str) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith((".", "_"))]
        found += [os.path.join(dirpath, f) for f in filenames if not f.startswith((".", "_"))]
    return found


def _files(src: str, fmt: str | None) -> tuple[str, list[str]]:
    """The data files under ``src`` (a file or directory) and their format."""
    if not os.path.exists(src):
        raise SharderError(f"SRC {src!r} does not exist; check the path.")
    paths = [src] if os.path.isfile(src) else _walk(src)
    kinds: dict[str, list[str]] = {}
    for path in paths:
        found = detect_format(path)
        if found == "webdataset" and not path.lower().endswith(".tar"):
            raise SharderError(f"{path!r} is a compressed tar; byte offsets inside it cannot be "
                               "read in place. Shard it with `stoker shard`, or decompress it.")
        if found in ("parquet", "webdataset"):
            kinds.setdefault(found, []).append(path)
    if fmt is None and len(kinds) > 1:
        raise SharderError(f"SRC {src!r} holds both Parquet files and tars; index one format "
                           "at a time (pass --format parquet or webdataset).")
    fmt = fmt or next(iter(kinds), None)
    if fmt not in kinds:
        raise SharderError(f"SRC {src!r} holds no {fmt or 'Parquet or .tar'} files to index; "
                           "point at a directory of Parquet files or uncompressed tars.")
    return fmt, sorted(kinds[fmt])


def _relative(path: str, dst: str) -> str:
    rel = os.path.relpath(os.path.realpath(path), os.path.realpath(dst))
    if rel.startswith(".."):
        raise SharderError(f"{path!r} is not inside DST {dst!r}; an index lives next to its data "
                           "(shard paths must stay inside the dataset). Choose a DST that "
                           "contains SRC, e.g. SRC itself.")
    return Path(rel).as_posix()


def index(src: str | os.PathLike[str], dst: str | os.PathLike[str] | None = None, *,
          format: str | None = None, overwrite: bool = False, workers: int = 1,
          executor: Executor | None = None) -> Manifest:
    """Write ``DST/manifest.json`` indexing the Parquet files or tars under ``src`` in place.

    Args:
        src: a Parquet file or ``.tar``, or a directory of them (walked recursively, names
            starting with ``.`` or ``_`` skipped; other files ignored).
        dst: the dataset directory; default ``src`` (its folder, for a file). Must contain
            every indexed file.
        format: ``"parquet"`` or ``"webdataset"``; detected when omitted.
        overwrite: replace an existing index manifest in ``dst``.
        workers: processes hashing files (or ``executor``).

    Raises:
        SharderError: nothing to index, a file outside ``dst``, schema mismatch, a bad tar,
            or ``dst`` already holds a manifest and ``overwrite`` is false.
    """
    src = os.path.abspath(os.fspath(src))
    dst = os.path.abspath(os.fspath(dst)) if dst is not None else \
        (src if os.path.isdir(src) else os.path.dirname(src))
    if format not in (None, "parquet", "webdataset"):
        raise SharderError(f"format={format!r} cannot be indexed; use parquet or webdataset.")
    fmt, paths = _files(src, format)
    if os.path.exists(os.path.join(dst, MANIFEST_NAME)) and not overwrite:
        raise SharderError(f"DST {dst!r} already holds a manifest.json; pass --overwrite to "
                           "replace it with a new index.")
    root = src if os.path.isdir(src) else os.path.dirname(src)
    inputs = []
    for path in paths:
        st = os.stat(path)
        inputs.append(InputFile(path, _relative(path, dst), fmt, st.st_size, st.st_mtime_ns,
                                _partitions(path, root) if fmt == "parquet" else ()))
    engine = executor or LocalExecutor(max(1, min(workers, len(inputs))))
    # results come back in any order: each carries its path
    hashes = dict(engine.map(_hash_parquet if fmt == "parquet" else _hash_pair, paths))
    if fmt == "parquet":
        schema, shards = _parquet(inputs, hashes)
    else:
        schema, shards = _tars(inputs, hashes)
    for f in inputs:
        size = os.stat(f.path).st_size
        if size != hashes[f.path][1]:
            raise SharderError(f"{f.path!r} changed while it was indexed (size {size}, hashed "
                               f"{hashes[f.path][1]}); run `stoker index` again.")
    sources = [{"path": s.path, "bytes": s.bytes, "xxh3_128": s.xxh3_128} for s in shards]
    manifest = Manifest.create(schema=schema, shards=shards, sources=sources,
                               options={"format": fmt, "index": True},
                               stoker_version=stoker_version(), kind=f"{fmt}-index")
    os.makedirs(dst, exist_ok=True)
    manifest.save(dst)
    return Manifest.load(dst)


def _hash_pair(path: str) -> tuple[str, tuple[str, int]]:
    return path, hash_file(path)


def _hash_parquet(path: str) -> tuple[str, tuple[str, int, dict[str, Any] | None]]:
    """The file's xxh3-128 and size, and ``extra.digests``: ``{"footer": [start, end,
    xxh3-128], "row_groups": [[start, end, xxh3-128], ...]}`` (``None`` when the footer's
    column chunk offsets do not give disjoint ranges inside the file: the loader then hashes
    the whole file)."""
    ranges = _parquet_ranges(path)
    if ranges is None:
        return path, (*hash_file(path), None)
    order = sorted(range(len(ranges)), key=lambda i: ranges[i][0])
    try:
        digest, size, parts = hash_file_ranges(path, [ranges[i] for i in order])
    except ValueError:  # overlapping column chunks: an unusual writer
        return path, (*hash_file(path), None)
    by_range = dict(zip(order, parts))
    spans = [[lo, hi, by_range[i]] for i, (lo, hi) in enumerate(ranges)]
    return path, (digest, size, {"footer": spans[-1], "row_groups": spans[:-1]})


def _parquet_ranges(path: str) -> list[tuple[int, int]] | None:
    """Byte ranges of each row group (its column chunks, as a Parquet reader computes them)
    and, last, of the footer (metadata, its length and the magic)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        f.seek(max(size - 8, 0))
        tail = f.read(8)
    if len(tail) < 8 or tail[4:] != b"PAR1":  # e.g. an encrypted footer: hash the whole file
        return None
    footer = (size - 8 - int.from_bytes(tail[:4], "little"), size)
    meta = pq.read_metadata(path)
    ranges = []
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        spans = []
        for c in range(group.num_columns):
            chunk = group.column(c)
            start = chunk.data_page_offset
            if chunk.has_dictionary_page and 0 < (chunk.dictionary_page_offset or 0) < start:
                start = chunk.dictionary_page_offset
            spans.append((start, start + chunk.total_compressed_size))
        if not spans:
            return None
        ranges.append((min(lo for lo, _ in spans), max(hi for _, hi in spans)))
    if any(lo < 4 or hi > footer[0] for lo, hi in ranges):
        return None
    return [*ranges, footer]


def _parquet(inputs: list[InputFile], hashes: dict[str, tuple[Any, ...]]
             ) -> tuple[pa.Schema, list[ShardInfo]]:
    plan = make_plan(inputs, ShardOptions(rows_per_shard=1, format="parquet"))
    shards = []
    for f, scan, values in zip(inputs, plan.scans, plan.partition_values):
        digest, size, digests = hashes[f.path]
        extra: dict[str, Any] = {"partitions": list(values)} if plan.partition_fields else {}
        if digests is not None and len(digests["row_groups"]) == len(scan.row_groups):
            extra["digests"] = digests
        shards.append(ShardInfo(f.rel, scan.rows, size, digest, scan.row_groups, extra))
    return plan.schema, shards


def _tars(inputs: list[InputFile], hashes: dict[str, tuple[str, int]]
          ) -> tuple[pa.Schema, list[ShardInfo]]:
    shards, first_exts = [], None
    for f in inputs:
        layout = tar_layout(f.path)
        offsets, exts = list(layout.offsets), list(layout.exts)
        if first_exts is None:
            first_exts = (exts, f.path)
        elif exts != first_exts[0]:
            raise SharderError(f"schema mismatch: samples of {f.path!r} have files {exts} but "
                               f"those of {first_exts[1]!r} have {first_exts[0]}; every tar "
                               "needs the same files per sample.")
        digest, size = hashes[f.path]
        rows = len(offsets) - 1
        shards.append(ShardInfo(f.rel, rows, size, digest, (rows,), {"offsets": offsets}))
    if first_exts is None:
        raise SharderError("no tar to index")
    return tar_schema(first_exts[0]), shards
