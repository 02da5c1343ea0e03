"""The sources beyond Parquet/CSV/JSONL: detection, scanning, reading, hashing.

``webdataset`` (tars), ``imagefolder`` (class-per-folder trees), ``hf`` (``save_to_disk``
directories) and ``tokens`` (``.npy``/``.bin`` token files). Each plugs into the same plan as
the tabular sources: an input has an exact row count and a schema from :func:`scan_source`,
and any row range can be read alone with :func:`read_source`, so shards are byte-identical
whatever the engine or worker count. See each module of :mod:`stoker.sharder.sources` for its
column rules.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Sequence

import pyarrow as pa

from stoker.manifest import hash_file
from stoker.sharder.errors import ShardOptionsError, SharderError
from stoker.sharder.inputs import InputFile, discover_inputs
from stoker.sharder.options import ShardOptions
from stoker.sharder.sources.hf import discover_hf, is_hf_dataset, read_arrow_rows, scan_arrow
from stoker.sharder.sources.images import (ClassFolder, discover_classes, hash_folder,
                                           image_schema, is_image_folder, read_images, scan_images,
                                           usable_images)
from stoker.sharder.sources.readers import FileScan
from stoker.sharder.sources.tokens import TokenFile, read_tokens, scan_tokens, token_count, \
    token_file
from stoker.sharder.sources.webdataset import read_tar, scan_tar

__all__ = ["SOURCE_FORMATS", "discover", "hash_source", "manifest_classes", "read_source",
           "scan_source", "source_options"]

SOURCE_FORMATS = ("webdataset", "imagefolder", "hf", "tokens")
_log = logging.getLogger(__name__)


def discover(sources: Sequence[str | os.PathLike[str]], options: ShardOptions) -> list[InputFile]:
    """The inputs of a run, for every format (tabular ones via ``discover_inputs``).

    A single directory is a Hugging Face dataset when it holds ``state.json`` and
    ``dataset_info.json`` (or ``dataset_dict.json``), an image folder when it holds only
    folders with images in them; otherwise files are detected by extension.
    """
    fmt = options.format
    single = os.fspath(sources[0]) if len(sources) == 1 else None
    is_dir = single is not None and os.path.isdir(single)
    if fmt == "hf" or (fmt is None and is_dir and is_hf_dataset(single)):
        if not is_dir or not is_hf_dataset(single):
            raise SharderError(f"--format hf needs one directory written by save_to_disk "
                               f"(with state.json and dataset_info.json); got {list(sources)}.")
        inputs = discover_hf(single)
    elif fmt == "imagefolder" or (fmt is None and is_dir and is_image_folder(single)):
        if not is_dir:
            raise SharderError(f"--format imagefolder needs one directory ROOT/<class>/<image>; "
                               f"got {list(sources)}.")
        inputs = discover_classes(single, options.on_bad == "skip")
    else:
        inputs = discover_inputs(sources, fmt)
    found = inputs[0].format
    if options.on_bad != "error" and found != "imagefolder":
        raise ShardOptionsError(f"--on-bad {options.on_bad} applies to image folders only, but "
                                f"the inputs are {found}; drop it.")
    if found == "tokens":
        return [token_file(f, options.token_dtype, options.seq_len) for f in inputs]
    if options.seq_len is not None or options.token_dtype is not None:
        raise ShardOptionsError(f"--seq-len/--token-dtype apply to token files only, but the "
                                f"inputs are {found}; drop them or pass --format tokens.")
    return inputs


def scan_source(inp: InputFile) -> FileScan:
    """Rows and schema of one input of a non-tabular format."""
    if inp.format == "webdataset":
        return FileScan(*scan_tar(inp.path))
    if inp.format == "imagefolder":
        return FileScan(scan_images(_as(inp, ClassFolder)), image_schema())
    if inp.format == "hf":
        try:
            return FileScan(*scan_arrow(inp.path))
        except (pa.ArrowException, OSError) as exc:
            raise SharderError(f"cannot read {inp.path!r} as an Arrow file ({exc}); the saved "
                               "dataset is damaged. Save it again.") from exc
    return FileScan(*scan_tokens(_as(inp, TokenFile)))


def read_source(inp: InputFile, columns: list[str], start: int, stop: int,
                schema: pa.Schema) -> pa.Table:
    """Rows ``[start, stop)`` of ``columns`` of one non-tabular input."""
    if inp.format == "webdataset":
        return read_tar(inp.path, schema, columns, start, stop, (inp.bytes, inp.mtime_ns))
    if inp.format == "imagefolder":
        return read_images(_as(inp, ClassFolder), columns, start, stop)
    if inp.format == "hf":
        return read_arrow_rows(inp.path, columns, start, stop)
    return read_tokens(_as(inp, TokenFile), start, stop).select(columns)


def hash_source(path: str) -> tuple[str, int]:
    """Provenance hash and size of an input: a file, or a class folder (see hash_folder)."""
    return hash_folder(path) if os.path.isdir(path) else hash_file(path)


def source_options(inputs: Sequence[InputFile], scans: Sequence[FileScan]) -> dict[str, Any]:
    """Format-specific options recorded in the manifest (they define the data)."""
    if inputs and isinstance(inputs[0], ClassFolder) and inputs[0].skip_bad:
        skipped = [{"path": f"{f.rel}/{rel}", "reason": why}
                   for f in inputs for rel, why in usable_images(f.path, True)[1]]
        for item in skipped:
            _log.warning("skipped %s: %s (recorded in the manifest)", item["path"], item["reason"])
        return {"on_bad": "skip", "skipped": skipped}
    if not inputs or inputs[0].format != "tokens":
        return {}
    first = _as(inputs[0], TokenFile)
    dropped = sum(token_count(_as(f, TokenFile)) - s.rows * first.seq_len
                  for f, s in zip(inputs, scans))
    if dropped:
        _log.warning(
            "token files: %d trailing tokens do not fill a sequence of %d and are not stored "
            "(recorded in the manifest as dropped_tokens)", dropped, first.seq_len)
    return {"seq_len": first.seq_len, "token_dtype": first.dtype, "token_tail": "drop",
            "dropped_tokens": int(dropped)}


def manifest_classes(inputs: Sequence[InputFile]) -> list[str] | None:
    """Class names (label order) of an image-folder run, else ``None``."""
    if not inputs or inputs[0].format != "imagefolder":
        return None
    return [f.rel for f in inputs]


def _as(inp: InputFile, cls: type) -> Any:
    if not isinstance(inp, cls):
        raise SharderError(f"internal: input {inp.path!r} of format {inp.format!r} was not "
                           f"discovered as a {cls.__name__}; use stoker.sharder.sources.discover.")
    return inp
