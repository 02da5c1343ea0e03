"""Build one shard's table from its row ranges: read, cast, add partition columns, concat."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import pyarrow as pa

from stoker.sharder.inputs import InputFile
from stoker.sharder.readers import read_rows

__all__ = ["Piece", "assemble_table"]


@dataclass(frozen=True, slots=True)
class Piece:
    """Rows ``[start, stop)`` of one input file, with what is needed to read them alone."""

    file: InputFile
    row_groups: tuple[int, ...]
    partition_values: tuple[Any, ...]
    start: int
    stop: int


def assemble_table(pieces: Sequence[Piece], file_schema: pa.Schema,
                   partition_fields: Sequence[pa.Field], schema: pa.Schema) -> pa.Table:
    """The rows of ``pieces`` in order, with exactly the columns and types of ``schema``.

    ``file_schema`` holds the unified types of the columns stored in the files and
    ``partition_fields`` the hive columns (constant per file); ``schema`` picks from both.
    """
    partition_index = {f.name: i for i, f in enumerate(partition_fields)}
    file_columns = [f.name for f in schema if f.name not in partition_index]
    tables = []
    for piece in pieces:
        n = piece.stop - piece.start
        table = read_rows(piece.file, file_schema, file_columns, piece.row_groups,
                          piece.start, piece.stop)
        arrays = []
        for field in schema:
            if field.name in partition_index:
                value = piece.partition_values[partition_index[field.name]]
                arrays.append(pa.nulls(n, field.type) if value is None
                              else pa.repeat(pa.scalar(value, field.type), n))
            else:
                arrays.append(table.column(field.name))
        tables.append(pa.Table.from_arrays(arrays, schema=schema))
    return pa.concat_tables(tables) if len(tables) != 1 else tables[0]
