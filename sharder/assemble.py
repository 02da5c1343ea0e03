"""Build one shard's table from its row ranges: read, cast, add partition columns, concat."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import pyarrow as pa

from stoker.sharder.inputs import InputFile
from stoker.sharder.sources.readers import RangeReader

__all__ = ["Piece", "add_partition_columns", "assemble_table"]


@dataclass(frozen=True, slots=True)
class Piece:
    """Rows ``[start, stop)`` of one input file, with what is needed to read them alone."""

    file: InputFile
    row_groups: tuple[int, ...]
    partition_values: tuple[Any, ...]
    start: int
    stop: int


def assemble_table(pieces: Sequence[Piece], file_schema: pa.Schema,
                   partition_fields: Sequence[pa.Field], schema: pa.Schema,
                   reader: RangeReader | None = None) -> pa.Table:
    """The rows of ``pieces`` in order, with exactly the columns and types of ``schema``.

    ``file_schema`` holds the unified types of the columns stored in the files and
    ``partition_fields`` the hive columns (constant per file); ``schema`` picks from both.
    Pass one ``reader`` for consecutive shards so text files are streamed once.
    """
    if reader is None:
        with RangeReader() as own:
            return assemble_table(pieces, file_schema, partition_fields, schema, own)
    names = {f.name for f in partition_fields}
    file_columns = [f.name for f in schema if f.name not in names]
    tables = []
    for piece in pieces:
        n = piece.stop - piece.start
        # Only hive columns selected: the rows are known from the plan, nothing to read.
        table = reader.read(piece.file, file_schema, file_columns, piece.row_groups,
                            piece.start, piece.stop) if file_columns \
            else pa.table({"_": pa.nulls(n)}).select([])
        tables.append(add_partition_columns(table, piece.partition_values, partition_fields,
                                            schema))
    return pa.concat_tables(tables) if len(tables) != 1 else tables[0]


def add_partition_columns(table: pa.Table, values: Sequence[Any],
                          partition_fields: Sequence[pa.Field], schema: pa.Schema) -> pa.Table:
    """``table`` (file columns) plus constant hive columns, in the order of ``schema``."""
    index = {f.name: i for i, f in enumerate(partition_fields)}
    n = table.num_rows
    arrays = []
    for field in schema:
        if field.name in index:
            value = values[index[field.name]]
            arrays.append(pa.nulls(n, field.type) if value is None
                          else pa.repeat(pa.scalar(value, field.type), n))
        else:
            arrays.append(table.column(field.name))
    return pa.Table.from_arrays(arrays, schema=schema)
