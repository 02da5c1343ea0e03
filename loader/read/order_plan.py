"""Order options for a stoker dataset, sized against the node's budgets before anything is read.

:func:`plan_order` resolves the loader's order options (default partitions from
:func:`~stoker.loader.order.working_set.default_partitions`), computes the rank's working set and
refuses, with the numbers, options the node cannot hold: a staging buffer larger than a quarter
of physical memory, or a cache limit below the shards the order needs live at once. A loader
that cannot fit never starts, so it never thrashes or stalls (issue 12).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from stoker.loader.fastpath.plan import FastPlan
from stoker.loader.fastpath.images import ImageOptions
from stoker.loader.order.options import OrderError, OrderOptions
from stoker.loader.fastpath.rowmajor import _list_width, _physical_memory
from stoker.loader.order.working_set import (DEFAULT_BLOCK, PARTITION_LADDER, STAGING_LIMIT,
                                       WorkingSet, default_partitions, working_set)
from stoker.manifest import Manifest

__all__ = ["OrderPlan", "WorkingSetError", "plan_order", "record_stride"]


class WorkingSetError(OrderError):
    """The order's working set does not fit a budget of this node; the message names both
    and options that fit."""


@dataclass(frozen=True, slots=True)
class OrderPlan:
    """Resolved order options and the working set they imply for one rank."""

    options: OrderOptions
    working_set: WorkingSet
    stride: int


def record_stride(manifest: Manifest, columns: Sequence[str] | None,
                  features: Sequence[str] | None, categoricals: Sequence[str] | None,
                  image: ImageOptions | None) -> int:
    """Bytes per staged row (a row-major record) for these outputs; list columns take their
    width from the first non-empty local shard, or are bounded by the dataset's bytes per row
    when the shards are remote (a conservative estimate)."""
    schema = manifest.arrow_schema
    names = list(columns) if columns is not None else list(schema.names)
    wanted = list(dict.fromkeys(names + list(features or ()) + list(categoricals or ())))
    if not FastPlan.supports(schema, features or (), categoricals or ()):
        return 0
    try:
        plan = FastPlan(schema, wanted, list(features or ()), list(categoricals or ()), image)
    except KeyError:
        return 0  # an unknown column: the source raises the error that names it
    stride = 0
    lists = []
    for o in plan.outputs:
        if o.kind in ("matrix", "fixed") and o.dtype is not None:
            stride += (len(o.columns) * np.dtype(o.dtype).itemsize + 7) // 8 * 8
        elif o.kind == "list" and o.dtype is not None:
            lists.append(o)
    if lists:
        batches = _first_local_batches(manifest)
        per_row = int(manifest.shard_bytes.sum()) // max(1, int(manifest.shard_rows.sum()))
        for o in lists:
            width = _list_width(batches, o.name) if batches is not None else 0
            stride += (width * np.dtype(o.dtype).itemsize + 7) // 8 * 8 if batches is not None \
                else (per_row + 7) // 8 * 8
    return stride


def _first_local_batches(manifest: Manifest) -> list[pa.RecordBatch] | None:
    """The first record batch of the first non-empty local shard (an indexed Parquet file's
    first row group); ``None`` for remote shards."""
    nonempty = np.flatnonzero(manifest.shard_rows > 0)
    kind = getattr(manifest, "kind", "arrow")
    if not len(nonempty) or kind not in ("arrow", "parquet-index"):
        return None
    location = manifest.shard_location(int(nonempty[0]))
    if "://" in location and not location.startswith("file://"):
        return None
    path = location.removeprefix("file://")
    if kind == "parquet-index":
        return pq.ParquetFile(path).read_row_group(0).to_batches()
    # the first record batch only, read (not mapped: a fault on a map reads megabytes around
    # it, and read_all of a 20 M-row dataset's first shard read all its 252 MB, cold)
    with pa.OSFile(path, "r") as source:
        return [pa.ipc.open_file(source).get_batch(0)]


def plan_order(manifest: Manifest, *, shuffle: bool, partitions: int | None, block_size: int,
               partition_mode: str, batch_size: int, world_size: int, stride: int,
               cache_limit: int | None = None, memory: int | None = None,
               readers: int = 1) -> OrderPlan:
    """Resolve the order options and check the working set (see the module docstring).

    Raises:
        WorkingSetError: the working set exceeds the staging memory (a quarter of physical
            memory, or ``memory``) or ``cache_limit``; names the figures and options that fit.
    """
    rows, sizes = manifest.shard_rows, manifest.shard_bytes
    memory = (_physical_memory() or 1 << 40) // 4 if memory is None else memory
    if getattr(manifest, "kind", "arrow") == "parquet-index":
        return _plan_index(manifest, shuffle, partitions, block_size, partition_mode,
                           batch_size, world_size, stride, memory)
    block = block_size or DEFAULT_BLOCK
    if partitions is None:
        partitions = default_partitions(rows, sizes, stride, cache_limit, block,
                                        readers=readers) if shuffle else 1
    if not block_size:  # the default block shrinks (by halves) until the working set fits
        while block > 1 and not _fit(working_set(
                rows, sizes, OrderOptions(partitions=partitions, block_size=block), world_size,
                stride, readers=readers), memory, cache_limit):
            block //= 2
    options = OrderOptions(shuffle=shuffle, partitions=partitions, block_size=block,
                           partition_mode=partition_mode).resolve(rows)
    window = (batch_size * world_size) * 4
    ws = working_set(rows, sizes, options, world_size, stride, window, readers)
    problems = []
    if ws.staging_bytes > memory:
        problems.append(f"staging {ws.staged_rows} rows x {stride} B = {ws.staging_bytes} B > "
                        f"{memory} B (a quarter of this node's memory)")
    if cache_limit is not None and ws.shard_bytes > cache_limit:
        problems.append(f"{ws.shards} shards live at once ({ws.shard_bytes} B) > the cache "
                        f"limit {cache_limit} B")
    if problems:
        raise WorkingSetError(
            f"the order's working set does not fit this node: {'; '.join(problems)} "
            f"(ShuffleOptions(partitions={options.partitions}, block_size={options.block_size}), "
            f"world_size={world_size}). "
            f"{_fits(rows, sizes, options, world_size, stride, memory, cache_limit, readers)}")
    return OrderPlan(options, ws, stride)


def _fit(ws: WorkingSet, memory: int, cache_limit: int | None) -> bool:
    return ws.staging_bytes <= memory and (cache_limit is None or ws.shard_bytes <= cache_limit)


def _fits(rows: np.ndarray, sizes: np.ndarray, options: OrderOptions, world_size: int,
          stride: int, memory: int, cache_limit: int | None, readers: int) -> str:
    """A sentence naming options that fit, or the budget that would."""
    for P in PARTITION_LADDER:
        if P >= options.partitions or P % world_size:
            continue
        opts = OrderOptions(partitions=P, block_size=options.block_size,
                            partition_mode=options.partition_mode).resolve(rows)
        ws = working_set(rows, sizes, opts, world_size, stride, readers=readers)
        if _fit(ws, memory, cache_limit):
            return (f"ShuffleOptions(partitions={P}) fits ({ws.shards} shards, {ws.shard_bytes} B "
                    f"live; staging {ws.staging_bytes} B); or raise CacheOptions(limit=...) / "
                    "lower block_size.")
    need = working_set(rows, sizes, options, world_size, stride, readers=readers).shard_bytes
    return (f"No smaller partition count fits; raise CacheOptions(limit=...) to at least "
            f"{need} B.")


def _plan_index(manifest: Manifest, shuffle: bool, partitions: int | None, block_size: int,
                partition_mode: str, batch_size: int, world_size: int, stride: int,
                memory: int) -> OrderPlan:
    """Indexed Parquet: the unit read at once is a row group, decoded in memory, so the working
    set counts row groups (``shards`` and ``shard_bytes`` are row groups and their decoded
    bytes, estimated at ``stride`` per row): default partitions fit decoded groups plus staging
    in :data:`~stoker.loader.order.working_set.STAGING_LIMIT`."""
    rows = manifest.shard_rows
    groups = np.array([r for s in manifest.shards for r in s.batch_rows], dtype=np.int64)
    decoded = groups * max(stride, 1)
    block = block_size or DEFAULT_BLOCK

    def ws_of(P: int, W: int) -> WorkingSet:
        opts = OrderOptions(partitions=P, block_size=block).resolve(rows)
        return working_set(groups, decoded, opts, W, stride)

    if partitions is None:
        partitions = 1 if not shuffle else next(
            (P for P in PARTITION_LADDER if P <= max(24, int(rows.sum()) // block)
             and ws_of(P, 1).shard_bytes + ws_of(P, 1).staging_bytes <= STAGING_LIMIT), 1)
    options = OrderOptions(shuffle=shuffle, partitions=partitions, block_size=block,
                           partition_mode=partition_mode).resolve(rows)
    ws = ws_of(options.partitions, world_size) if shuffle else \
        working_set(groups, decoded, options, world_size, stride, batch_size * world_size * 4)
    if shuffle and ws.shard_bytes + ws.staging_bytes > memory:
        raise WorkingSetError(
            f"the order's working set does not fit this node: {ws.shards} decoded row groups "
            f"({ws.shard_bytes} B) plus staging ({ws.staging_bytes} B) > {memory} B (a quarter "
            f"of this node's memory) (partitions={options.partitions}, block_size="
            f"{options.block_size}, world_size={world_size}). Use fewer partitions, or rewrite "
            "the files with smaller row groups.")
    return OrderPlan(options, ws, stride)
