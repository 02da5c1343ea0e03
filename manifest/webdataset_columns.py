"""How a WebDataset sample becomes an Arrow row: the column rules shared by sharder and loader.

Part of the dataset contract: ``stoker shard`` writes WebDataset tars into native shards with
these rules and ``stoker index`` datasets are read in place with the same ones, so both live
here, where the sharder and the loader may import them (data flows
``sharder -> manifest <- loader``; neither imports the other).

- ``__key__`` (string): the sample key (the member path without its extensions).
- ``txt``, ``text``, ``json`` (string): the member's UTF-8 text, unparsed (JSON stays text,
  so its bytes round-trip exactly); invalid UTF-8 is an error.
- ``cls`` (int64): an ASCII integer, WebDataset's class-label convention; anything else is an
  error.
- every other extension (``jpg``, ``png``, ``seg.png``, ``npy``, ...) is binary, bytes as stored.

Member names split into key and extension as ``webdataset.tariterators`` splits them
(``base_plus_ext``, ``__*__`` metadata skipped, extensions lower-cased); the rules are
replicated because importing ``webdataset`` imports torch (~1 s), and a test checks that the
two agree.
"""

from __future__ import annotations

import io
import re
import tarfile
from typing import Any, Sequence

import pyarrow as pa

from stoker.manifest.errors import StokerError

__all__ = ["KEY_COLUMN", "SampleFormatError", "base_plus_ext", "column_type", "is_meta",
           "parse_members", "samples_to_table", "tar_schema", "typed_value"]

KEY_COLUMN = "__key__"
_STRING_EXTS = ("txt", "text", "json")
_INT_EXTS = ("cls",)
# webdataset.tariterators: tar_file_iterator's skip_meta default, meta_prefix/meta_suffix and
# base_plus_ext's pattern (webdataset 1.0)
_META = re.compile(r"__[^/]*__($|/)")
_META_PREFIX = _META_SUFFIX = "__"
_BASE_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


class SampleFormatError(StokerError, ValueError):
    """A WebDataset member cannot become a column value (bad text/integer, no extension, ...)."""


def is_meta(name: str) -> bool:
    """Members WebDataset's tar iterator skips (``__*__`` metadata)."""
    return bool(_META.match(name)) or (
        "/" not in name and name.startswith(_META_PREFIX) and name.endswith(_META_SUFFIX))


def base_plus_ext(path: str) -> tuple[str | None, str | None]:
    """Sample key and extension(s) of a member name, as WebDataset splits them."""
    match = _BASE_EXT.match(path)
    return (match.group(1), match.group(2)) if match else (None, None)


def column_type(ext: str) -> pa.DataType:
    """The Arrow type of the column for files with extension ``ext``."""
    if ext == KEY_COLUMN or ext in _STRING_EXTS:
        return pa.string()
    if ext in _INT_EXTS:
        return pa.int64()
    return pa.binary()


def tar_schema(exts: Sequence[str]) -> pa.Schema:
    """``__key__`` then one column per extension, sorted."""
    return pa.schema([pa.field(KEY_COLUMN, pa.string(), False)]
                     + [pa.field(e, column_type(e), False) for e in sorted(exts)])


def typed_value(path: str, key: str, ext: str, data: bytes) -> Any:
    """The column value of one member: text, an integer, or the bytes (see module rules).

    Raises:
        SampleFormatError: a text member that is not UTF-8, an integer member that is not one.
    """
    t = column_type(ext)
    try:
        if pa.types.is_string(t):
            return data.decode("utf-8")
        if pa.types.is_integer(t):
            return int(data.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError) as exc:
        what = "UTF-8 text" if pa.types.is_string(t) else "an ASCII integer"
        raise SampleFormatError(f"{path!r}: sample {key!r} file .{ext} is not {what} "
                                f"({data[:20]!r}...); fix the file or rename its extension so "
                                "it is kept as binary.") from exc
    return data


def samples_to_table(path: str, samples: Sequence[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """WebDataset sample dicts (raw bytes per extension) -> a table with exactly ``schema``'s
    columns, typed by :func:`typed_value`."""
    arrays = []
    for field in schema:
        if field.name == KEY_COLUMN:
            values = [s[KEY_COLUMN] for s in samples]
        else:
            values = [typed_value(path, s[KEY_COLUMN], field.name, s[field.name]) for s in samples]
        arrays.append(pa.array(values, field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def parse_members(data: bytes, path: str = "<span>") -> dict[str, Any]:
    """One sample dict from the raw tar bytes of its members (headers included).

    ``data`` is the byte span ``stoker index`` records per sample of an uncompressed tar; the
    dict has ``__key__`` and one raw ``bytes`` value per (lower-cased) extension, as
    WebDataset's ``group_by_keys`` would yield it.

    Raises:
        SampleFormatError: the span is not a tar, holds a member without extension, a file
            twice, or not exactly one sample.
    """
    sample: dict[str, Any] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for member in tar:
                if not member.isreg() or is_meta(member.name):
                    continue
                key, ext = base_plus_ext(member.name)
                if key is None or ext is None:
                    raise SampleFormatError(f"{path!r}: member {member.name!r} has no extension, "
                                            "so it belongs to no sample column; rename it (e.g. "
                                            "KEY.bin) or remove it from the tar.")
                first = sample.setdefault(KEY_COLUMN, key)
                if first != key:
                    raise SampleFormatError(f"{path!r}: the span holds samples {first!r} and "
                                            f"{key!r}, expected one sample; the offsets do not "
                                            "match the tar. Index it again.")
                ext = ext.lower()
                if ext in sample:
                    raise SampleFormatError(f"{path!r}: duplicate file {member.name!r} in sample "
                                            f"{key!r}; remove one of them from the tar.")
                sample[ext] = tar.extractfile(member).read()  # type: ignore[union-attr]
    except tarfile.TarError as exc:
        raise SampleFormatError(f"{path!r}: the span is not tar members ({exc}); the offsets do "
                                "not match the tar. Index it again.") from exc
    if KEY_COLUMN not in sample:
        raise SampleFormatError(f"{path!r}: the span holds no sample; the offsets do not match "
                                "the tar. Index it again.")
    return sample
