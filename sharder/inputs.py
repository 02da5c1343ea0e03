"""Find the input files of a sharding run: paths, directories, globs and hive partitions.

The result is sorted by path relative to a common base directory, so the plan (and the
output) does not depend on directory listing order, on the current directory, or on where
the source tree lives.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence
from urllib.parse import unquote

from stoker.sharder.errors import SharderError

__all__ = ["InputFile", "detect_format", "discover_inputs", "source_roots"]

_EXTENSIONS = {
    "parquet": (".parquet", ".pq", ".parq"),
    "csv": (".csv", ".csv.zst"),
    "jsonl": (".jsonl", ".ndjson", ".json", ".jsonl.zst", ".ndjson.zst", ".json.zst"),
    "webdataset": (".tar", ".tgz", ".tar.gz", ".tar.zst"),
    "tokens": (".npy", ".bin"),
}
_GLOB_MAGIC = re.compile(r"[*?[]")
_HIVE_DEFAULT = "__HIVE_DEFAULT_PARTITION__"


@dataclass(frozen=True, slots=True)
class InputFile:
    """One input file.

    Attributes:
        path: absolute path, used to read the file.
        rel: POSIX path relative to the common base of all inputs (recorded in provenance).
        format: ``"parquet"``, ``"csv"`` or ``"jsonl"``.
        bytes: file size when discovered.
        mtime_ns: modification time when discovered (resume notices changed inputs).
        partitions: hive ``key=value`` pairs from the directories above the file, raw strings
            (``None`` for the hive default partition).
    """

    path: str
    rel: str
    format: str
    bytes: int
    mtime_ns: int
    partitions: tuple[tuple[str, str | None], ...] = ()


def detect_format(path: str) -> str | None:
    """The format its extension names, or ``None``."""
    name = path.lower()
    for fmt, exts in _EXTENSIONS.items():
        if name.endswith(exts):
            return fmt
    return None


def _hidden(name: str) -> bool:
    # Spark/Hive write _SUCCESS, _metadata and .crc files beside the data: never data.
    return name.startswith((".", "_"))


def _walk(root: str) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not _hidden(d)]
        found += [os.path.join(dirpath, f) for f in filenames if not _hidden(f)]
    return found


def source_roots(sources: Sequence[str | os.PathLike[str]]) -> list[str]:
    """The directory each source names: itself, a glob's fixed prefix, or a file's parent."""
    roots = []
    for src in sources:
        text = os.fspath(src)
        if _GLOB_MAGIC.search(text):
            prefix = text[:_GLOB_MAGIC.search(text).start()]
            roots.append(os.path.abspath(prefix if prefix.endswith(os.sep) else
                                         os.path.dirname(prefix) or "."))
        elif os.path.isdir(text):
            roots.append(os.path.abspath(text))
        else:
            roots.append(os.path.dirname(os.path.abspath(text)))
    return roots


def _expand(src: str, fmt: str | None) -> list[str]:
    if _GLOB_MAGIC.search(src):
        files = [p for p in glob.glob(src, recursive=True) if os.path.isfile(p)]
        if not files:
            raise SharderError(f"SRC {src!r} matches no file; check the pattern (quote it so the "
                               "shell does not expand it) and that the files exist.")
        return files
    if os.path.isdir(src):
        files = _walk(src)
        files = [f for f in files if (detect_format(f) is not None if fmt is None
                                      else detect_format(f) in (fmt, None))]
        if not files:
            raise SharderError(f"SRC directory {src!r} holds no Parquet, CSV or JSONL file; "
                               "point at the data files or pass --format.")
        return files
    if os.path.exists(src):
        return [src]
    raise SharderError(f"SRC {src!r} does not exist; check the path (relative paths are "
                       f"taken from {os.getcwd()!r}).")


def _partitions(path: str, root: str) -> tuple[tuple[str, str | None], ...]:
    rel_dir = os.path.relpath(os.path.dirname(path), root)
    pairs = []
    for part in Path(rel_dir).parts:
        key, sep, value = part.partition("=")
        if sep and key and part != ".":
            raw = unquote(value)
            pairs.append((unquote(key), None if raw in ("", _HIVE_DEFAULT) else raw))
    return tuple(pairs)


def discover_inputs(sources: Sequence[str | os.PathLike[str]],
                    fmt: str | None = None) -> list[InputFile]:
    """Every input file named by ``sources``, deduplicated and sorted by relative path.

    Raises:
        SharderError: a source does not exist or matches nothing, a file's format cannot be
            detected, inputs mix formats, or hive partition keys disagree between files.
    """
    if not sources:
        raise SharderError("no SRC given; name at least one file, directory or glob.")
    roots = source_roots(sources)
    # real path -> (absolute path as named, the root its partitions are read from)
    found: dict[str, tuple[str, str]] = {}
    for src, root in zip(sources, roots):
        for path in _expand(os.fspath(src), fmt):
            found.setdefault(os.path.realpath(path), (os.path.abspath(path), root))
    base = os.path.commonpath(roots)
    inputs = []
    for path, root in found.values():
        file_fmt = fmt or detect_format(path)
        if file_fmt is None:
            raise SharderError(f"cannot tell the format of {path!r} from its extension; "
                               "pass --format parquet|csv|jsonl.")
        st = os.stat(path)
        rel = Path(os.path.relpath(path, base)).as_posix()
        inputs.append(InputFile(path, rel, file_fmt, st.st_size, st.st_mtime_ns,
                                _partitions(path, root)))
    inputs.sort(key=lambda f: (f.rel, f.path))
    formats = sorted({f.format for f in inputs})
    if len(formats) > 1:
        first = {f.format: f.rel for f in reversed(inputs)}
        shown = ", ".join(f"{k}: {first[k]!r}" for k in formats)
        raise SharderError(f"inputs mix formats ({shown}); shard one format at a time or pass "
                           "--format.")
    keys = {tuple(k for k, _ in f.partitions) for f in inputs}
    if len(keys) > 1:
        a, b = sorted(keys)[:2]
        fa = next(f.rel for f in inputs if tuple(k for k, _ in f.partitions) == a)
        fb = next(f.rel for f in inputs if tuple(k for k, _ in f.partitions) == b)
        raise SharderError(f"hive partition keys differ: {fa!r} has {list(a)} but {fb!r} has "
                           f"{list(b)}; every file needs the same key=value directories.")
    return inputs
