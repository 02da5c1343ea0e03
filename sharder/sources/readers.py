"""Read input files: exact row counts and schemas for the plan, row ranges for the shards.

Parquet row ranges come from the covering row groups (found from the footer), so a shard
task reads only what it needs. CSV and JSONL have no index: a range is read by streaming
the file from its start (a :class:`RangeReader` continues one stream over consecutive
ranges, so a group of shards reads the file once). Every file is read with the one schema
the plan chose, so types are identical in every shard.
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

from stoker.sharder.errors import SharderError, SourceValueError
from stoker.sharder.inputs import InputFile

__all__ = ["FileScan", "RangeReader", "read_head", "read_rows", "scan_file"]

# Formats read here; the others (webdataset, imagefolder, hf, tokens):
# stoker.sharder.sources.dispatch.
_TABULAR = ("parquet", "csv", "jsonl")


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


# What reading or converting a file's values may raise: a typed SharderError instead. Python's
# OverflowError comes from values out of range (a date past year 9999 in a struct, a number
# too large for its target type), which pyarrow raises as-is.
_READ_ERRORS = (pa.ArrowException, OSError, ValueError, OverflowError, zstandard.ZstdError)


@contextlib.contextmanager
def _guard(inp: InputFile, locate: Any = None) -> Iterator[None]:
    """Turn read errors into a SharderError naming the file; ``locate(exc)`` may name the
    row group and column (a SourceValueError)."""
    try:
        yield
    except SharderError:
        raise
    except _READ_ERRORS as exc:
        found = locate(exc) if locate is not None else None
        raise (found or _bad_file(inp, exc)) from exc


def _value_error(inp: InputFile, group: int, column: str, exc: BaseException) -> SourceValueError:
    text = str(exc).strip()
    detail = text.splitlines()[0] if text else "no detail"
    return SourceValueError(
        f"{inp.path!r}, row group {group}, column {column!r}: {type(exc).__name__}: {detail}. "
        "The value cannot be read or converted (a corrupt page, or a value out of range such "
        "as a date past year 9999). Fix or drop that column (`--columns`), or remove the file.",
        inp.path, group, column)


def _locate_parquet(inp: InputFile, target: pa.Schema, columns: list[str],
                    groups: range) -> Any:
    """``locate`` for a Parquet read: read the groups column by column (only after a failure)
    and name the first (row group, column) that fails the same way."""
    def locate(exc: BaseException) -> SourceValueError | None:
        try:
            pf = pq.ParquetFile(inp.path)
        except _READ_ERRORS:
            return None
        for group in range(groups.start, min(groups.stop, pf.metadata.num_row_groups)):
            for name in columns:
                try:
                    col = pf.read_row_group(group, columns=[name]).column(name)
                    want = target.field(name).type if name in target.names else col.type
                    if col.type != want:
                        col.cast(want)
                    if isinstance(exc, OverflowError):  # raised converting values to Python
                        col.to_pylist()
                except _READ_ERRORS as inner:
                    return _value_error(inp, group, name, inner)
        return None
    return locate


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
        if inp.format not in _TABULAR:
            from stoker.sharder.sources import scan_source

            return scan_source(inp)
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
    with RangeReader() as reader:
        return reader.read(inp, schema, columns, row_groups, start, stop)


class RangeReader:
    """Reads row ranges of input files (see :func:`read_rows`).

    CSV and JSONL have no row index, so a range is found by streaming from the file start.
    Ascending ranges of one file read through one ``RangeReader`` continue the same stream,
    so a task writing several consecutive shards of a text file reads it once. Batches come
    from the same stream positions either way, so the result does not depend on reuse.
    """

    def __init__(self) -> None:
        self._stack: contextlib.ExitStack | None = None
        self._key: tuple[str, tuple[str, ...]] | None = None
        self._batches: Iterator[pa.RecordBatch] = iter(())
        self._batch: pa.RecordBatch | None = None
        self._batch_start = 0  # row index in the file of ``_batch``'s first row

    def __enter__(self) -> "RangeReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the open stream, if any."""
        if self._stack is not None:
            self._stack.close()
        self._stack, self._key, self._batch = None, None, None

    def read(self, inp: InputFile, schema: pa.Schema, columns: list[str],
             row_groups: tuple[int, ...], start: int, stop: int) -> pa.Table:
        """Rows ``[start, stop)`` of ``inp`` with exactly the types of ``schema``."""
        locate = _locate_parquet(inp, schema, columns, _groups_of(row_groups, start, stop)) \
            if inp.format == "parquet" else None
        with _guard(inp, locate):
            if inp.format == "parquet":
                table = _parquet_rows(inp, columns, row_groups, start, stop)
            elif inp.format not in _TABULAR:
                from stoker.sharder.sources import read_source

                table = read_source(inp, columns, start, stop, schema)
            else:
                table = self._text_rows(inp, schema, columns, start, stop)
            return _checked(inp, table, schema, columns, start, stop)

    def _open(self, inp: InputFile, schema: pa.Schema, columns: list[str]) -> None:
        self.close()
        self._stack = contextlib.ExitStack()
        stream = self._stack.enter_context(_open_text(inp))
        if inp.format == "csv":
            convert = pcsv.ConvertOptions(column_types=schema, include_columns=columns)
            reader: Any = pcsv.open_csv(stream, convert_options=convert)
        else:
            parse = pjson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
            reader = pjson.open_json(stream, parse_options=parse)
        self._key = (inp.path, tuple(columns))
        self._batches, self._batch, self._batch_start = iter(reader), None, 0

    def _text_rows(self, inp: InputFile, schema: pa.Schema, columns: list[str],
                   start: int, stop: int) -> pa.Table:
        if self._key != (inp.path, tuple(columns)) or start < self._batch_start:
            self._open(inp, schema, columns)
        pieces = []
        while True:
            if self._batch is None:
                self._batch = next(self._batches, None)
                if self._batch is None:
                    break
            batch, first = self._batch, self._batch_start
            lo, hi = max(start - first, 0), min(stop - first, batch.num_rows)
            if hi > lo:
                pieces.append(batch.slice(lo, hi - lo))
            if first + batch.num_rows > stop:
                break  # the next range may start inside this batch: keep it
            self._batch, self._batch_start = None, first + batch.num_rows
            if self._batch_start >= stop:
                break
        if not pieces:
            return schema.empty_table().select(columns)
        return pa.Table.from_batches(pieces).select(columns)


def _checked(inp: InputFile, table: pa.Table, schema: pa.Schema, columns: list[str],
             start: int, stop: int) -> pa.Table:
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
    with _guard(inp, _locate_parquet(inp, schema, columns, range(1 << 31))):
        batch = next(pq.ParquetFile(inp.path).iter_batches(batch_size=rows, columns=columns))
    arrays = [batch.column(c) for c in columns]
    target = pa.schema([schema.field(c) for c in columns])
    arrays = [a if a.type == f.type else a.cast(f.type) for a, f in zip(arrays, target)]
    return pa.Table.from_arrays(arrays, schema=target)


def _groups_of(row_groups: tuple[int, ...], start: int, stop: int) -> range:
    """The row groups holding rows ``[start, stop)``."""
    offsets = [0]
    for n in row_groups:
        offsets.append(offsets[-1] + n)
    return range(bisect.bisect_right(offsets, start) - 1, bisect.bisect_left(offsets, stop))


def _parquet_rows(inp: InputFile, columns: list[str], row_groups: tuple[int, ...],
                  start: int, stop: int) -> pa.Table:
    groups = _groups_of(row_groups, start, stop)
    table = pq.ParquetFile(inp.path).read_row_groups(groups, columns=columns)
    return table.slice(start - sum(row_groups[:groups.start]), stop - start)
