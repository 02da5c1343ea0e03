"""Read input files: exact row counts and schemas for the plan, row ranges for the shards.

Parquet row ranges come from the covering row groups (found from the footer), so a shard
task reads only what it needs. CSV and JSONL have no index: a range is read by streaming
the file from its start and stopping once the range is complete. Every file is read with
the one schema the plan chose, so types are identical in every shard.
"""

from __future__ import annotations

import bisect
import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pjson
import pyarrow.parquet as pq
import zstandard

from stoker.sharder.errors import SharderError
from stoker.sharder.inputs import InputFile

__all__ = ["FileScan", "read_head", "read_rows", "scan_file"]


@dataclass(frozen=True, slots=True)
class FileScan:
    """What the plan learns from one file: exact rows, its own schema, row-group sizes."""

    rows: int
    schema: pa.Schema
    row_groups: tuple[int, ...] = ()


def _bad_file(inp: InputFile, exc: BaseException) -> SharderError:
    text = str(exc).strip()
    detail = getattr(exc, "strerror", None) or (text.splitlines()[0] if text else "no detail")
    return SharderError(
        f"cannot read {inp.path!r} as {inp.format} ({type(exc).__name__}: {detail}); the file "
        "is unreadable, truncated or not in that format. Fix or remove it, or pass --format.")


@contextlib.contextmanager
def _guard(inp: InputFile) -> Iterator[None]:
    try:
        yield
    except SharderError:
        raise
    except (pa.ArrowException, OSError, ValueError, zstandard.ZstdError) as exc:
        raise _bad_file(inp, exc) from exc


@contextlib.contextmanager
def _open_text(inp: InputFile) -> Iterator[Any]:
    """A pyarrow-readable stream of the file's text, decompressing ``.zst`` with zstandard."""
    if not inp.path.endswith(".zst"):
        with pa.OSFile(inp.path, "rb") as f:
            yield f
        return
    with open(inp.path, "rb") as raw, \
            zstandard.ZstdDecompressor().stream_reader(raw, read_size=1 << 20) as text:
        yield pa.PythonFile(text, mode="r")


def scan_file(inp: InputFile) -> FileScan:
    """Rows and schema of ``inp`` (Parquet: from the footer; CSV/JSONL: a full read).

    Raises:
        SharderError: the file is unreadable or not valid in its format.
    """
    with _guard(inp):
        if inp.format == "parquet":
            meta = pq.ParquetFile(inp.path).metadata
            groups = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
            return FileScan(meta.num_rows, meta.schema.to_arrow_schema(), groups)
        try:
            return _stream_scan(inp)
        except pa.ArrowInvalid:
            # A streaming reader fixes types from the first block and fails on a wider value
            # later; a whole-file read infers each column's type from all of its values.
            with _open_text(inp) as stream:
                table = pcsv.read_csv(stream) if inp.format == "csv" else pjson.read_json(stream)
            return FileScan(table.num_rows, table.schema)


def _stream_scan(inp: InputFile) -> FileScan:
    """Count rows block by block (memory stays at one block); types from the first block.

    When every later value fits those types, they are the types a whole-file read infers
    too (inference takes the narrowest type of a fixed order that fits all values).
    """
    with _open_text(inp) as stream:
        reader = pcsv.open_csv(stream) if inp.format == "csv" else pjson.open_json(stream)
        rows = sum(batch.num_rows for batch in reader)
        return FileScan(rows, reader.schema)


def read_rows(inp: InputFile, schema: pa.Schema, columns: list[str], row_groups: tuple[int, ...],
              start: int, stop: int) -> pa.Table:
    """Rows ``[start, stop)`` of ``inp``, columns ``columns``, cast to their type in ``schema``.

    ``schema`` is the plan's unified schema of file columns (partition columns excluded).
    """
    with _guard(inp):
        if inp.format == "parquet":
            table = _parquet_rows(inp, columns, row_groups, start, stop)
        else:
            table = _text_rows(inp, schema, columns, start, stop)
        if table.num_rows != stop - start:
            raise SharderError(
                f"{inp.path!r} has fewer rows than when the plan counted them (wanted rows "
                f"{start}..{stop}, got {table.num_rows}); the file changed during sharding. "
                "Run `stoker shard` again.")
        target = pa.schema([schema.field(c) for c in columns])
        arrays = [table.column(c) for c in columns]
        arrays = [a if a.type == f.type else a.cast(f.type) for a, f in zip(arrays, target)]
        return pa.Table.from_arrays(arrays, schema=target)


def read_head(inp: InputFile, schema: pa.Schema, columns: list[str], rows: int) -> pa.Table:
    """About the first ``rows`` rows of ``inp`` (a cheap sample; Parquet decodes no more pages
    than needed). Deterministic, but batch layout may differ from :func:`read_rows`."""
    if inp.format != "parquet":
        return read_rows(inp, schema, columns, (), 0, rows)
    with _guard(inp):
        batch = next(pq.ParquetFile(inp.path).iter_batches(batch_size=rows, columns=columns))
    arrays = [batch.column(c) for c in columns]
    target = pa.schema([schema.field(c) for c in columns])
    arrays = [a if a.type == f.type else a.cast(f.type) for a, f in zip(arrays, target)]
    return pa.Table.from_arrays(arrays, schema=target)


def _parquet_rows(inp: InputFile, columns: list[str], row_groups: tuple[int, ...],
                  start: int, stop: int) -> pa.Table:
    offsets = [0]
    for n in row_groups:
        offsets.append(offsets[-1] + n)
    first = bisect.bisect_right(offsets, start) - 1
    last = bisect.bisect_left(offsets, stop) - 1
    table = pq.ParquetFile(inp.path).read_row_groups(range(first, last + 1), columns=columns)
    return table.slice(start - offsets[first], stop - start)


def _text_rows(inp: InputFile, schema: pa.Schema, columns: list[str],
               start: int, stop: int) -> pa.Table:
    pieces = []
    seen = 0
    with _open_text(inp) as stream:
        if inp.format == "csv":
            convert = pcsv.ConvertOptions(column_types=schema, include_columns=columns)
            reader = pcsv.open_csv(stream, convert_options=convert)
        else:
            parse = pjson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
            reader = pjson.open_json(stream, parse_options=parse)
        for batch in reader:
            lo, hi = max(start - seen, 0), min(stop - seen, batch.num_rows)
            if hi > lo:
                pieces.append(batch.slice(lo, hi - lo))
            seen += batch.num_rows
            if seen >= stop:
                break
    if not pieces:
        return schema.empty_table().select(columns)
    return pa.Table.from_batches(pieces).select(columns)
