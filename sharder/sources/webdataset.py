"""WebDataset tars as a sharder source: one sample per key, one column per file extension.

Read through the ``webdataset`` package (``tar_file_iterator`` + ``group_by_keys``), so a
sample is exactly what WebDataset itself would yield. An uncompressed ``.tar`` is scanned by
its member headers (:mod:`stoker.sharder.sources.tar_layout`, the offsets ``stoker index``
records) and each sample read by its byte span, so any row range is read alone;
``.tgz``/``.tar.gz`` are read as streams and ``.tar.zst`` is decompressed with ``zstandard``
first (consecutive ranges of one file then continue one stream).

Column rules (``__key__`` string, ``txt``/``text``/``json`` UTF-8 text, ``cls`` int64, any
other extension binary) are :mod:`stoker.manifest.webdataset_columns`, shared with the loader,
which reads ``stoker index`` datasets with the same rules; here their errors are
:class:`SharderError`.

Every sample of every tar must have the same extensions: a sample that lacks one (or has an
extra one) is an error naming the tar, the sample key and the extensions, never a silent null.
Members without an extension are errors too; top-level ``__*__`` metadata files are skipped,
as WebDataset skips them.
"""

from __future__ import annotations

import contextlib
import itertools
import tarfile
import threading
from typing import Any, Iterator, Sequence

import pyarrow as pa
import zstandard

from stoker.manifest import webdataset_columns as _columns
from stoker.manifest.webdataset_columns import KEY_COLUMN, column_type, tar_schema
from stoker.sharder.errors import SharderError
from stoker.sharder.sources.tar_layout import tar_layout

__all__ = ["KEY_COLUMN", "check_exts", "column_type", "iter_samples", "open_tar", "read_tar",
           "sample_exts", "samples_to_table", "scan_tar", "tar_schema", "typed_value"]


@contextlib.contextmanager
def open_tar(path: str) -> Iterator[Any]:
    """A binary stream of the tar's bytes (``.tar.zst`` decompressed; gzip left to tarfile)."""
    with open(path, "rb") as raw:
        if path.lower().endswith(".zst"):
            with zstandard.ZstdDecompressor().stream_reader(raw, read_size=1 << 20) as plain:
                yield plain
        else:
            yield raw


def _members(stream: Any, path: str) -> Iterator[dict[str, Any]]:
    from webdataset.tariterators import base_plus_ext, tar_file_iterator

    for member in tar_file_iterator(stream):
        prefix, _ = base_plus_ext(member["fname"])
        if prefix is None:
            raise SharderError(f"{path!r}: member {member['fname']!r} has no extension, so it "
                               "belongs to no sample column; rename it (e.g. KEY.bin) or "
                               "remove it from the tar.")
        member["__url__"] = path
        yield member


def iter_samples(path: str, start: int = 0, stop: int | None = None) -> Iterator[dict[str, Any]]:
    """Samples ``[start, stop)`` of the tar at ``path`` as WebDataset dicts (raw bytes).

    Raises:
        SharderError: unreadable or corrupt tar, duplicate member names, a repeated key.
    """
    from webdataset.tariterators import group_by_keys

    seen: set[str] = set()
    try:
        with open_tar(path) as stream:
            for i, sample in enumerate(group_by_keys(_members(stream, path))):
                key = sample["__key__"]
                if key in seen:
                    raise SharderError(f"{path!r}: sample key {key!r} appears twice (its files "
                                       "are not next to each other in the tar); write each "
                                       "sample's files together.")
                seen.add(key)
                if stop is not None and i >= stop:
                    return
                if i >= start:
                    yield sample
    except SharderError:
        raise
    except (tarfile.TarError, OSError, EOFError, zstandard.ZstdError, ValueError) as exc:
        raise SharderError(f"cannot read {path!r} as a WebDataset tar ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}); the file "
                           "is truncated or not a tar. Fix or remove it.") from exc


def sample_exts(sample: dict[str, Any]) -> list[str]:
    """The data extensions of a WebDataset sample dict."""
    return sorted(k for k in sample if not k.startswith("__"))


def check_exts(path: str, sample: dict[str, Any], expected: Sequence[str]) -> None:
    """Raise when ``sample`` does not have exactly the extensions ``expected``."""
    got = sample_exts(sample)
    if got != list(expected):
        missing = sorted(set(expected) - set(got))
        extra = sorted(set(got) - set(expected))
        raise SharderError(
            f"{path!r}: sample {sample['__key__']!r} has files {got} but the dataset's samples "
            f"have {list(expected)} (missing {missing}, extra {extra}); every sample needs the "
            "same files. Add the missing files or remove the sample from the tar.")


def typed_value(path: str, key: str, ext: str, data: bytes) -> Any:
    """The column value of one member (:func:`stoker.manifest.webdataset_columns.typed_value`).

    Raises:
        SharderError: a text member that is not UTF-8, an integer member that is not one.
    """
    try:
        return _columns.typed_value(path, key, ext, data)
    except _columns.SampleFormatError as exc:
        raise SharderError(str(exc)) from exc


def samples_to_table(path: str, samples: Sequence[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """WebDataset sample dicts -> a table with exactly ``schema``'s columns.

    Raises:
        SharderError: a member's bytes do not fit its column (see :func:`typed_value`).
    """
    try:
        return _columns.samples_to_table(path, samples, schema)
    except _columns.SampleFormatError as exc:
        raise SharderError(str(exc)) from exc


def _seekable(path: str) -> bool:
    return path.lower().endswith(".tar")


def scan_tar(path: str) -> tuple[int, pa.Schema]:
    """Samples and schema of one tar; all its samples must have the same extensions.

    An uncompressed tar is scanned by its headers (data is skipped, bar typed members); a
    compressed one is read through.
    """
    if _seekable(path):
        layout = tar_layout(path)
        return len(layout.keys), tar_schema(layout.exts)
    rows, exts = 0, None
    for sample in iter_samples(path):
        if exts is None:
            exts = sample_exts(sample)
        check_exts(path, sample, exts)
        rows += 1
    if exts is None:
        raise SharderError(f"{path!r} holds no samples; remove the empty tar from SRC.")
    return rows, tar_schema(exts)


class _Cursor(threading.local):
    """Where the last read of this thread stopped: consecutive ranges of one tar (a group of
    shards) continue the same stream instead of re-reading the tar from its start."""

    path: tuple[str, Any] | None = None
    position = 0
    samples: Iterator[dict[str, Any]] = iter(())


_cursor = _Cursor()


def read_tar(path: str, schema: pa.Schema, columns: list[str], start: int, stop: int,
             identity: Any = None) -> pa.Table:
    """Samples ``[start, stop)`` as a table of ``columns`` (types from ``schema``).

    ``identity`` (e.g. size and mtime when planned) tells a continued stream from one over a
    file that was replaced since.
    """
    exts = sorted(n for n in schema.names if n != KEY_COLUMN)
    target = pa.schema([schema.field(c) for c in columns])
    if _seekable(path):
        return samples_to_table(path, _spans(path, exts, start, stop), target)
    cur = _cursor
    if cur.path != (path, identity) or cur.position > start:
        close = getattr(cur.samples, "close", None)
        if close is not None:
            close()
        cur.path, cur.position, cur.samples = (path, identity), 0, iter_samples(path)
    cur.path = None  # invalid until this read completes
    samples = []
    for sample in itertools.islice(cur.samples, start - cur.position, stop - cur.position):
        check_exts(path, sample, exts)
        samples.append(sample)
    if len(samples) != stop - start:
        raise SharderError(f"{path!r} holds fewer samples than when the plan counted them "
                           f"(wanted {start}..{stop}); the file changed during sharding. "
                           "Run `stoker shard` again.")
    cur.path, cur.position = (path, identity), stop
    return samples_to_table(path, samples, target)


def _spans(path: str, exts: list[str], start: int, stop: int) -> list[dict[str, Any]]:
    """Samples ``[start, stop)`` of an uncompressed tar, read in one span by their offsets."""
    layout = tar_layout(path)
    if stop > len(layout.keys):
        raise SharderError(f"{path!r} holds {len(layout.keys)} samples, fewer than when the plan "
                           f"counted them (wanted {start}..{stop}); the file changed during "
                           "sharding. Run `stoker shard` again.")
    if list(layout.exts) != exts:
        raise SharderError(f"{path!r}: samples have files {list(layout.exts)} but the dataset's "
                           f"have {exts}; every tar needs the same files per sample.")
    base = layout.offsets[start]
    with open(path, "rb") as f:
        f.seek(base)
        span = f.read(layout.offsets[stop] - base)
    if len(span) != layout.offsets[stop] - base:
        raise SharderError(f"{path!r} is shorter than when it was scanned; the file changed "
                           "during sharding. Run `stoker shard` again.")
    view = memoryview(span)
    samples = []
    for i in range(start, stop):
        sample: dict[str, Any] = {"__key__": layout.keys[i]}
        for ext, offset, size in layout.members[i]:
            sample[ext] = bytes(view[offset - base:offset - base + size])
        samples.append(sample)
    return samples

