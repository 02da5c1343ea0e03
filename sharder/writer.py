"""Execute one task of a plan: write a shard (Arrow IPC file) or hash an input file.

Tasks are small picklable dataclasses and :func:`run_task` is a plain top-level function,
so any executor (in-process, process pool, Dask) can run them; each writes its own output
and a done-record, and returns a small dict.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from stoker.manifest import canonical_json
from stoker.sharder.assemble import Piece, assemble_table
from stoker.sharder.atomic import atomic_write, write_bytes_atomic
from stoker.sharder.options import MIN_BATCH_BYTES
from stoker.sharder.sources import hash_source
from stoker.sharder.sources.readers import RangeReader

__all__ = ["HashTask", "ShardGroup", "ShardTask", "batch_rows_for", "read_record", "run_task",
           "write_table"]


@dataclass(frozen=True, slots=True)
class ShardTask:
    """Write shard ``index`` of a plan to ``dst/path`` and its done-record to ``record``."""

    index: int
    dst: str
    path: str
    record: str
    pieces: tuple[Piece, ...]
    file_schema: pa.Schema
    partition_fields: tuple[pa.Field, ...]
    schema: pa.Schema
    compression: str
    batch_bytes: int
    batch_rows: int


@dataclass(frozen=True, slots=True)
class HashTask:
    """Hash input ``index`` (provenance) and write its done-record to ``record``."""

    index: int
    path: str
    rel: str
    record: str


@dataclass(frozen=True, slots=True)
class ShardGroup:
    """Consecutive shards written in order by one worker, sharing one :class:`RangeReader`
    (a CSV/JSONL file is then streamed once instead of once per shard)."""

    shards: tuple[ShardTask, ...]


Task = ShardTask | ShardGroup | HashTask


def run_task(task: Task) -> list[dict[str, Any]]:
    """Run one task; return its (JSON-able) results, each also saved as a done-record."""
    if isinstance(task, HashTask):
        digest, size = hash_source(task.path)
        result: dict[str, Any] = {"kind": "source", "index": task.index, "path": task.rel,
                                  "bytes": size, "xxh3_128": digest, "rows": 0}
        write_bytes_atomic(task.record, canonical_json(result))
        return [result]
    with RangeReader() as reader:
        return [_write_shard(t, reader)
                for t in (task.shards if isinstance(task, ShardGroup) else (task,))]


def _write_shard(task: ShardTask, reader: RangeReader) -> dict[str, Any]:
    table = assemble_table(task.pieces, task.file_schema, task.partition_fields, task.schema,
                           reader)
    info = write_table(table, Path(task.dst) / task.path, task.compression, task.batch_bytes,
                       task.batch_rows)
    result = {"kind": "shard", "index": task.index, "path": task.path, **info}
    write_bytes_atomic(task.record, canonical_json(result))
    return result


_WRITE_BUFFER = 8 << 20
_GROUP_BATCHES = 64


def batch_rows_for(table: pa.Table, batch_bytes: int, batch_rows: int) -> int:
    """Rows per record batch: ``batch_bytes`` of this table's average row, at most
    ``batch_rows`` unless those hold fewer than ``MIN_BATCH_BYTES``, at least 1."""
    def rows_of(nbytes: int) -> int:
        return nbytes * table.num_rows // max(1, table.nbytes)

    cap = max(batch_rows, rows_of(min(MIN_BATCH_BYTES, batch_bytes)))
    return max(1, min(cap, rows_of(batch_bytes)))


def write_table(table: pa.Table, target: Path, compression: str,
                batch_bytes: int, batch_rows: int) -> dict[str, Any]:
    """Write ``table`` as an Arrow IPC file at ``target`` atomically; return its record.

    Batches hold ``batch_rows_for(table)`` rows (the last fewer). Each batch is one
    contiguous chunk per column (64 batches' rows are made contiguous at a time: a copy only
    where they span input chunks).
    """
    step = batch_rows_for(table, batch_bytes, batch_rows)
    options = pa.ipc.IpcWriteOptions(
        compression=None if compression == "none" else compression, use_threads=False)
    sizes = []
    with atomic_write(target) as out:
        # Arrow writes each buffer on its own (~150 a W1 batch of 1,024 rows): coalesced in
        # 8 MiB natively, the hashing Python file sees a few dozen writes a shard. With a
        # write per buffer and a Table per batch, 2 M W1 rows took 2.6-2.8 s of CPU to shard,
        # now 2.3-2.5 s, as with 4 MiB batches (2.1-2.5 s)
        with pa.BufferedOutputStream(pa.PythonFile(out, mode="w"),
                                     buffer_size=_WRITE_BUFFER) as sink, \
                pa.ipc.new_file(sink, table.schema, options=options) as w:
            # one contiguous copy per group of batches, cut into batches natively
            group = step * _GROUP_BATCHES
            for offset in range(0, table.num_rows, group):
                for batch in table.slice(offset, group).combine_chunks().to_batches(
                        max_chunksize=step):
                    w.write_batch(batch)
                    sizes.append(batch.num_rows)
    return {"rows": table.num_rows, "bytes": out.size, "xxh3_128": out.hexdigest(),
            "batch_rows": sizes, "arrow_bytes": table.nbytes}


def read_record(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """A done-record, or ``None`` when it is missing or unreadable (the task is then redone)."""
    try:
        return json.loads(Path(path).read_bytes())
    except (OSError, ValueError):
        return None
