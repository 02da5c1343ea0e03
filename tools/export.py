"""Export a stoker dataset (native or index) to WebDataset tars or Parquet files, for other tools.

One output file per shard, rows in dataset order (sample ids count up), so the export of a
dataset is deterministic and a re-import (``stoker shard``) gives the same rows.

- ``parquet``: ``OUT/part-00000.parquet`` ... with the dataset's schema; row groups follow the
  shard's record batches.
- ``webdataset``: ``OUT/shard-00000.tar`` ... one sample per row, key = the ``__key__`` column
  when there is one, else the sample id zero-padded to 12 digits; one member ``KEY.COLUMN``
  per other column: binary as is, strings as UTF-8, integers and floats as ASCII text, other
  types (lists, structs) as JSON. Members have mtime 0, uid/gid 0 and mode 0644, so tars are
  byte-identical across runs. WebDataset has no nulls: a null value is an error naming the
  column and sample (fill it, or export to Parquet).

Native shards are hashed while read and checked against the manifest; index datasets check
their files the same way (stoker.loader.read.indexed.source).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from stoker.manifest import (Manifest, ShardIntegrityError, StokerError, hash_bytes, path_problem,
                             resolve_inside)

__all__ = ["EXPORT_FORMATS", "ExportError", "export"]

EXPORT_FORMATS = ("webdataset", "parquet")


class ExportError(StokerError):
    """The export cannot be done as asked (bad OUT, unknown format, a value WebDataset lacks)."""


def export(dataset: str | os.PathLike[str], out: str | os.PathLike[str], *, to: str,
           overwrite: bool = False) -> list[str]:
    """Write every shard of ``dataset`` to ``out`` in format ``to``; return the files written.

    Raises:
        ExportError: ``to`` unknown, ``out`` not empty (without ``overwrite``), a null value
            in a WebDataset export.
        ShardIntegrityError: a shard does not match the manifest.
    """
    if to not in EXPORT_FORMATS:
        raise ExportError(f"--to {to!r} is not supported; use one of {', '.join(EXPORT_FORMATS)}.")
    manifest = Manifest.load(os.fspath(dataset))
    out_path = Path(os.path.abspath(os.fspath(out)))
    if out_path.exists() and any(out_path.iterdir()):
        if not overwrite:
            raise ExportError(f"OUT {str(out_path)!r} is not empty; pass --overwrite to replace "
                              "its contents, or choose a new directory.")
        shutil.rmtree(out_path)
    out_path.mkdir(parents=True, exist_ok=True)
    from stoker.sharder.atomic import atomic_write

    written = []
    start = 0
    width = max(5, len(str(manifest.num_shards - 1)))
    for index, table in _shard_tables(manifest):
        name = f"part-{index:0{width}d}.parquet" if to == "parquet" else \
            f"shard-{index:0{width}d}.tar"
        with atomic_write(out_path / name) as f:
            if to == "parquet":
                rows = max(manifest.shards[index].batch_rows or (1,))
                pq.write_table(table, pa.PythonFile(f, mode="w"), row_group_size=max(1, rows))
            else:
                _write_tar(f, table, start)
        written.append(str(out_path / name))
        start += table.num_rows
    return written


def _shard_tables(manifest: Manifest) -> Iterator[tuple[int, pa.Table]]:
    """Each shard's rows in order, checked against the manifest."""
    if manifest.kind != "arrow":
        from stoker.loader.read.indexed.source import IndexSource

        source = IndexSource(manifest)
        try:
            starts = np.concatenate([[0], np.cumsum(manifest.shard_rows)]).astype(np.int64)
            for i in range(manifest.num_shards):
                yield i, source.take(np.arange(starts[i], starts[i + 1]))
        finally:
            source.close()
        return
    root = (manifest.root or ".").removeprefix("file://")
    for i, info in enumerate(manifest.shards):
        path = resolve_inside(root, info.path, f"shards[{i}].path")
        data = Path(path).read_bytes()
        if len(data) != info.bytes or hash_bytes(data) != info.xxh3_128:
            raise ShardIntegrityError(f"{path}: does not match the manifest (size or xxh3-128); "
                                      "run `stoker verify` and restore the shard.", shard=info.path)
        yield i, pa.ipc.open_file(pa.py_buffer(data)).read_all()


def _encode(value: Any, t: pa.DataType) -> bytes:
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return bytes(value)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return value.encode("utf-8")
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return repr(value).encode("ascii")
    if pa.types.is_boolean(t):
        return b"1" if value else b"0"
    return json.dumps(value, sort_keys=True, default=str).encode("utf-8")


def _write_tar(f: Any, table: pa.Table, first_id: int) -> None:
    keys = table.column("__key__").to_pylist() if "__key__" in table.column_names else \
        [f"{first_id + i:012d}" for i in range(table.num_rows)]
    columns = [(name, table.schema.field(name).type, table.column(name).to_pylist())
               for name in table.column_names if name != "__key__"]
    # stream mode ("w|"): the hashing writer has no tell()/seek()
    with tarfile.open(fileobj=f, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for i, key in enumerate(keys):
            for name, t, values in columns:
                if values[i] is None:
                    raise ExportError(f"column {name!r} of sample {first_id + i} (key {key!r}) is "
                                      "null and WebDataset has no nulls; fill the value or "
                                      "export with --to parquet.")
                data = _encode(values[i], t)
                info = tarfile.TarInfo(_member_name(key, name, first_id + i))
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(data))


def _member_name(key: Any, column: str, sample: int) -> str:
    """``KEY.COLUMN``, held to the manifest's path rule (stoker.manifest.path_rules): a key or
    column name from the data must not make a member that unpacks outside the target."""
    name = f"{key}.{column}"
    problem = path_problem(name)
    if problem is not None:
        raise ExportError(f"sample {sample}: the tar member name {name!r} (key {key!r}, column "
                          f"{column!r}) has {problem}, so unpacking the tar could write outside "
                          "its directory. Rename the key or column, or export with --to parquet.")
    return name
