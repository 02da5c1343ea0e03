"""The sharding plan: a pure function of the inputs and the options.

It fixes the sorted inputs, their exact row counts, the one output schema and the shard
boundaries (global row stream cut every ``rows_per_shard`` rows). Executing shard ``k`` needs
nothing but the plan, so the output cannot depend on worker count, engine or timing.
"""

from __future__ import annotations

import base64
import bisect
import itertools
import re
from dataclasses import dataclass
from typing import Any, Sequence

import pyarrow as pa

from stoker.manifest import canonical_json, hash_bytes
from stoker.sharder.assemble import Piece, add_partition_columns
from stoker.sharder.errors import SharderError
from stoker.sharder.inputs import InputFile
from stoker.sharder.options import ShardOptions
from stoker.sharder.sources import source_options
from stoker.sharder.sources.readers import FileScan, read_head, scan_file

__all__ = ["SAMPLE_ROWS", "Plan", "make_plan"]

#: Rows at the head of the first non-empty input measured to turn ``shard_size`` into rows.
SAMPLE_ROWS = 8192
_INT = re.compile(r"^-?[0-9]{1,18}$")


def _strip(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, f.type, f.nullable) for f in schema])


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything that defines the output, decided before any shard is written.

    Attributes:
        inputs: input files in order, with their exact row counts.
        scans: per input, rows / schema / row-group sizes as scanned.
        file_schema: unified types of the columns stored in the files.
        partition_fields: hive partition columns (after the file columns).
        partition_values: per input, the typed value of each partition column.
        schema: the output schema (selected columns, in output order, no metadata).
        rows_per_shard: rows in every shard but the last.
        options: the resolved options that define the data (recorded in the manifest).
        offsets: global row index of each input's first row, plus the total at the end.
    """

    inputs: tuple[InputFile, ...]
    scans: tuple[FileScan, ...]
    file_schema: pa.Schema
    partition_fields: tuple[pa.Field, ...]
    partition_values: tuple[tuple[Any, ...], ...]
    schema: pa.Schema
    rows_per_shard: int
    options: dict[str, Any]
    offsets: tuple[int, ...]

    @property
    def num_rows(self) -> int:
        return self.offsets[-1]

    @property
    def num_shards(self) -> int:
        return -(-self.num_rows // self.rows_per_shard)

    def shard_path(self, index: int) -> str:
        """``shards/00042.arrow``: zero-padded to 5 digits, more when there are more shards."""
        width = max(5, len(str(self.num_shards - 1)))
        return f"shards/{index:0{width}d}.arrow"

    def pieces(self, index: int) -> list[Piece]:
        """The row ranges of shard ``index``, one per input file it touches, in order."""
        lo = index * self.rows_per_shard
        hi = min(lo + self.rows_per_shard, self.num_rows)
        pieces = []
        for i in range(bisect.bisect_right(self.offsets, lo) - 1, len(self.scans)):
            offset, scan = self.offsets[i], self.scans[i]
            if offset >= hi:
                break
            start, stop = max(lo - offset, 0), min(hi - offset, scan.rows)
            if stop > start:
                pieces.append(Piece(self.inputs[i], scan.row_groups, self.partition_values[i],
                                    start, stop))
        return pieces

    def to_dict(self) -> dict[str, Any]:
        """JSON form kept in the build folder; its hash tells a resumable build from a stale one."""
        return {
            "inputs": [{"path": f.path, "rel": f.rel, "format": f.format, "bytes": f.bytes,
                        "mtime_ns": f.mtime_ns, "rows": s.rows, "row_groups": list(s.row_groups),
                        "partitions": [list(p) for p in f.partitions]}
                       for f, s in zip(self.inputs, self.scans)],
            "file_schema": base64.b64encode(self.file_schema.serialize().to_pybytes()).decode(),
            "schema": base64.b64encode(self.schema.serialize().to_pybytes()).decode(),
            "rows_per_shard": self.rows_per_shard,
            "options": self.options,
        }

    @property
    def plan_hash(self) -> str:
        return hash_bytes(canonical_json(self.to_dict()))


def make_plan(inputs: Sequence[InputFile], options: ShardOptions) -> Plan:
    """Scan every input and decide schema and shard boundaries.

    Raises:
        SharderError: unreadable input, schema mismatch (names both files and the field),
            unknown column, or no rows at all.
    """
    scans = tuple(scan_file(f) for f in inputs)
    fmt = inputs[0].format
    file_schema = _unify(inputs, scans, strict=(fmt in ("parquet", "hf")),
                         same_columns=(fmt != "jsonl"))
    partition_fields, partition_values = _partition_columns(inputs, file_schema)
    full = pa.schema(list(file_schema) + list(partition_fields))
    schema = _select(full, options.columns)
    offsets = (0, *itertools.accumulate(s.rows for s in scans))
    if offsets[-1] == 0:
        raise SharderError(f"the {len(inputs)} input file(s) hold 0 rows (first: "
                           f"{inputs[0].path!r}); there is nothing to shard. Check SRC.")
    plan = Plan(tuple(inputs), scans, file_schema, partition_fields, partition_values, schema,
                1, {}, offsets)
    rows_per_shard = options.rows_per_shard or _rows_for_bytes(plan, options.target_shard_bytes)
    resolved = {"rows_per_shard": rows_per_shard, "compression": options.compression,
                "columns": None if options.columns is None else list(options.columns),
                "format": fmt, "batch_bytes": options.batch_bytes,
                "batch_rows": options.batch_rows,
                **source_options(inputs, scans)}
    return Plan(tuple(inputs), scans, file_schema, partition_fields, partition_values, schema,
                rows_per_shard, resolved, offsets)


def _rows_for_bytes(plan: Plan, target: int) -> int:
    """Rows that make ``target`` uncompressed Arrow bytes, from a deterministic sample."""
    first = next(i for i, s in enumerate(plan.scans) if s.rows)
    n = min(SAMPLE_ROWS, plan.scans[first].rows)
    names = {f.name for f in plan.partition_fields}
    columns = [f.name for f in plan.schema if f.name not in names]
    head = read_head(plan.inputs[first], plan.file_schema, columns, n) if columns \
        else pa.table({"_": pa.nulls(n)}).select([])
    sample = add_partition_columns(head, plan.partition_values[first], plan.partition_fields,
                                   plan.schema)
    return max(1, target * sample.num_rows // max(1, sample.nbytes))


def _unify(inputs: Sequence[InputFile], scans: Sequence[FileScan], *, strict: bool,
           same_columns: bool) -> pa.Schema:
    """One schema for all files; Parquet types must match, CSV/JSONL types may widen."""
    fields: dict[str, pa.Field] = {}
    owner: dict[str, int] = {}
    for i, scan in enumerate(scans):
        names = set(scan.schema.names)
        if len(names) != len(scan.schema):
            raise SharderError(f"{inputs[i].path!r} has duplicate column names "
                               f"{scan.schema.names}; rename them before sharding.")
        if same_columns and i:
            ref = set(scans[0].schema.names)
            for name in sorted(ref ^ names):
                has, lacks = (0, i) if name in ref else (i, 0)
                raise SharderError(
                    f"schema mismatch: field {name!r} is in {inputs[has].path!r} but not in "
                    f"{inputs[lacks].path!r}; every input needs the same columns.")
        for field in scan.schema:
            old = fields.get(field.name)
            if old is None:
                fields[field.name], owner[field.name] = _plain(field), i
                continue
            merged = _merge(old, _plain(field), strict)
            if merged is None:
                raise SharderError(
                    f"schema mismatch: field {field.name!r} is {old.type} in "
                    f"{inputs[owner[field.name]].path!r} but {field.type} in {inputs[i].path!r}; "
                    "convert the files to one type before sharding.")
            fields[field.name] = merged
    return pa.schema(list(fields.values()))


def _plain(field: pa.Field) -> pa.Field:
    return pa.field(field.name, field.type, field.nullable)


def _merge(a: pa.Field, b: pa.Field, strict: bool) -> pa.Field | None:
    nullable = a.nullable or b.nullable
    if a.type == b.type:
        return pa.field(a.name, a.type, nullable)
    if strict:
        return None
    try:
        return pa.unify_schemas([pa.schema([a]), pa.schema([b])],
                                promote_options="permissive").field(0).with_nullable(nullable)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None


def _partition_columns(inputs: Sequence[InputFile], file_schema: pa.Schema
                       ) -> tuple[tuple[pa.Field, ...], tuple[tuple[Any, ...], ...]]:
    """Hive columns: int64 when every value of a key is an integer, else string."""
    keys = [k for k, _ in inputs[0].partitions]
    fields, columns = [], []
    for j, key in enumerate(keys):
        if key in file_schema.names:
            raise SharderError(f"hive partition key {key!r} (from {inputs[0].path!r}) is also a "
                               "column inside the files; rename the directory or the column.")
        raw = [f.partitions[j][1] for f in inputs]
        is_int = all(v is None or _INT.match(v) for v in raw)
        fields.append(pa.field(key, pa.int64() if is_int else pa.string(), True))
        columns.append([None if v is None else int(v) if is_int else v for v in raw])
    values = tuple(tuple(col[i] for col in columns) for i in range(len(inputs)))
    return tuple(fields), values


def _select(full: pa.Schema, columns: Sequence[str] | None) -> pa.Schema:
    if columns is None:
        return full
    missing = [c for c in columns if c not in full.names]
    if missing:
        raise SharderError(f"column(s) {missing} not in the inputs; available columns: "
                           f"{full.names}. Fix --columns.")
    return pa.schema([full.field(c) for c in columns])
