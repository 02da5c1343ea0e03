"""A Hugging Face dataset saved with ``Dataset.save_to_disk`` as a sharder source.

Reads the directory directly with pyarrow, so the ``datasets`` package is not needed: the
Arrow files listed in ``state.json`` (``_data_files``, in that order; IPC stream format, as
``datasets`` writes them) hold the rows, ``dataset_info.json`` marks the layout. Columns and
types are the Arrow ones (a ``datasets`` ``Image`` feature is its ``struct<bytes, path>``);
the ``huggingface`` schema metadata is dropped like all schema metadata.

A ``DatasetDict`` directory (``dataset_dict.json``) is refused with the list of its splits
(shard one split directory); a dataset saved with an indices mapping is refused (call
``flatten_indices()`` before ``save_to_disk``).
"""

from __future__ import annotations

import json
import os
from typing import Any

import pyarrow as pa

from stoker.sharder.errors import SharderError
from stoker.sharder.inputs import InputFile

__all__ = ["discover_hf", "is_hf_dataset", "read_arrow_rows", "scan_arrow"]


def is_hf_dataset(root: str) -> bool:
    """True for a ``save_to_disk`` directory (a Dataset or a DatasetDict)."""
    return os.path.isfile(os.path.join(root, "dataset_dict.json")) or (
        os.path.isfile(os.path.join(root, "state.json"))
        and os.path.isfile(os.path.join(root, "dataset_info.json")))


def _json(path: str) -> Any:
    try:
        with open(path, "rb") as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise SharderError(f"cannot read {path!r} ({type(exc).__name__}: {exc}); the saved "
                           "dataset is damaged. Save it again with save_to_disk.") from exc


def discover_hf(root: str) -> list[InputFile]:
    """The dataset's Arrow files, in the order ``state.json`` lists them.

    Raises:
        SharderError: a DatasetDict, an indices mapping, a missing or unlisted data file.
    """
    root = os.path.abspath(root)
    if os.path.isfile(os.path.join(root, "dataset_dict.json")):
        splits = _json(os.path.join(root, "dataset_dict.json")).get("splits", [])
        raise SharderError(f"{root!r} is a DatasetDict with splits {splits}; shard one split, "
                           f"e.g. `stoker shard {os.path.join(root, str((splits or ['train'])[0]))} "
                           "DST`.")
    state = _json(os.path.join(root, "state.json"))
    if state.get("_indices_data_files"):
        raise SharderError(f"{root!r} was saved with an indices mapping (a filtered, shuffled or "
                           "selected view); call dataset.flatten_indices() and save_to_disk again.")
    files = [entry.get("filename") for entry in state.get("_data_files") or []]
    if not files or not all(isinstance(f, str) and f for f in files):
        raise SharderError(f"{os.path.join(root, 'state.json')!r} lists no data files "
                           f"(_data_files={state.get('_data_files')!r}); save the dataset again.")
    inputs = []
    for name in files:
        path = os.path.join(root, name)
        if not os.path.isfile(path):
            raise SharderError(f"{path!r} is listed in state.json but missing; the saved dataset "
                               "is incomplete. Save it again with save_to_disk.")
        st = os.stat(path)
        inputs.append(InputFile(path, name, "hf", st.st_size, st.st_mtime_ns))
    return inputs


def _open(path: str) -> pa.Table:
    source = pa.memory_map(path, "r")
    try:
        return pa.ipc.open_stream(source).read_all()
    except pa.ArrowInvalid:
        source.seek(0)
        return pa.ipc.open_file(source).read_all()


def scan_arrow(path: str) -> tuple[int, pa.Schema]:
    """Rows and schema of one Arrow file (memory-mapped: no copy of the data)."""
    table = _open(path)
    return table.num_rows, table.schema


def read_arrow_rows(path: str, columns: list[str], start: int, stop: int) -> pa.Table:
    """Rows ``[start, stop)`` of ``columns``."""
    return _open(path).select(columns).slice(start, stop - start)
