"""A batch dict on the wire: ``stoker.batch/1``, one Arrow record batch of one row.

Each entry of the batch is one column of that row, in the batch's key order:

* a tensor (any dtype, any shape) or a NumPy array: ``large_binary``, its bytes in C order
  (sent zero-copy from the tensor's memory);
* a list of ``str``/``None`` or ``bytes``/``None`` (string and binary columns):
  ``large_list<large_string>`` / ``large_list<large_binary>``;
* anything else a server-side transform returns must survive JSON unchanged: a
  ``large_string`` of its JSON.

The schema's metadata ``stoker.batch`` (JSON) says how to rebuild each entry (``kind``,
``dtype``, ``shape``) and carries the reply's facts: the xxh3-64 of the batch's ids (``ids``),
the content digests (``stoker.content/1``, see stoker.loader.ledger.digest) of the batch as
sent (``digests`` over ``digest_columns``), and, when a server-side transform ran, its name and
version and the digests of the batch before it (``content``, what the ledger records). The
client recomputes ``digests`` on what it received: equal digests mean equal bytes.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import torch
import xxhash

from stoker.manifest import StokerError

__all__ = ["BATCH_FORMAT", "WireError", "decode_batch", "digest_columns", "encode_batch",
           "ids_digest"]

BATCH_FORMAT = "stoker.batch/1"
_META = b"stoker.batch"
_TORCH = {str(t): t for t in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32,
                              torch.int64, torch.float16, torch.bfloat16, torch.float32,
                              torch.float64, torch.complex64, torch.complex128)}


class WireError(StokerError, ValueError):
    """A batch cannot be sent (a value of a kind the wire format does not carry) or a reply
    is not a ``stoker.batch/1`` batch."""


def ids_digest(ids: np.ndarray) -> int:
    """xxh3-64 of a batch's ids as little-endian int64 (client and server compare it)."""
    return xxhash.xxh3_64_intdigest(np.ascontiguousarray(ids, dtype="<i8").tobytes())


def digest_columns(batch: Mapping[str, Any]) -> list[str]:
    """The batch's entries a digest covers: every key but ``NAME_lengths`` beside ``NAME``
    (digested together with ``NAME``)."""
    return [k for k in batch if not (k.endswith("_lengths") and k[:-8] in batch)]


def _raw(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if not t.is_cpu:
        t = t.cpu()
    t = t.contiguous()
    return t.reshape(-1).view(torch.uint8).numpy() if t.numel() else np.empty(0, np.uint8)


def _bytes_array(raw: np.ndarray) -> pa.Array:
    offsets = pa.py_buffer(np.array([0, raw.nbytes], dtype=np.int64))
    return pa.Array.from_buffers(pa.large_binary(), 1, [None, offsets, pa.py_buffer(raw)])


def _column(name: str, value: Any) -> tuple[pa.Array, dict[str, Any]]:
    if isinstance(value, torch.Tensor):
        return _bytes_array(_raw(value)), {"kind": "tensor", "dtype": str(value.dtype),
                                           "shape": list(value.shape)}
    if isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value)
        return _bytes_array(a.reshape(-1).view(np.uint8)), {
            "kind": "ndarray", "dtype": a.dtype.str, "shape": list(a.shape)}
    if isinstance(value, list) and all(v is None or isinstance(v, str) for v in value):
        return _list_of(value, pa.large_string()), {"kind": "str"}
    if isinstance(value, list) and all(v is None or isinstance(v, bytes) for v in value):
        return _list_of(value, pa.large_binary()), {"kind": "bytes"}
    text = json.dumps(value, sort_keys=True)
    if json.loads(text) != value or type(json.loads(text)) is not type(value):
        raise WireError(f"batch entry {name!r} is a {type(value).__name__} that JSON does not "
                        "carry unchanged; a served batch holds tensors, arrays, lists of str or "
                        "bytes, or JSON values (make the server-side transform return those).")
    return pa.array([text], pa.large_string()), {"kind": "json"}


def _list_of(values: list[Any], kind: pa.DataType) -> pa.Array:
    return pa.LargeListArray.from_arrays(pa.array([0, len(values)], pa.int64()),
                                         pa.array(values, kind))


def encode_batch(batch: Mapping[str, Any], facts: Mapping[str, Any]) -> pa.RecordBatch:
    """The record batch of ``batch``; ``facts`` (ids, digests, ...) go into its metadata."""
    if not isinstance(batch, Mapping) or not all(isinstance(k, str) for k in batch):
        raise WireError(f"a served batch must be a dict of str -> value, got "
                        f"{type(batch).__name__}; make the server-side transform return one.")
    arrays, fields = [], []
    for name, value in batch.items():
        array, field = _column(name, value)
        arrays.append(array)
        fields.append({"name": name, **field})
    meta = json.dumps({"format": BATCH_FORMAT, "fields": fields, **facts})
    schema = pa.schema([pa.field(f["name"], a.type) for f, a in zip(fields, arrays)],
                       metadata={_META: meta.encode()})
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _value(column: pa.Array, field: Mapping[str, Any]) -> Any:
    kind = field["kind"]
    if kind in ("tensor", "ndarray"):
        data, start, stop = _bytes_of(column)
        raw = np.frombuffer(data, dtype=np.uint8, count=stop - start, offset=start)
        if kind == "ndarray":
            return raw.view(np.dtype(field["dtype"])).reshape(field["shape"]).copy()
        dtype = _TORCH.get(field["dtype"])
        if dtype is None:
            raise WireError(f"batch entry {field['name']!r} has dtype {field['dtype']!r}, "
                            f"which this client cannot rebuild (known: {sorted(_TORCH)}).")
        out = torch.empty(field["shape"], dtype=dtype)
        if out.numel():
            out.reshape(-1).view(torch.uint8).numpy()[:] = raw
        return out
    if kind in ("str", "bytes"):
        return column.values.to_pylist()
    if kind == "json":
        return json.loads(column[0].as_py())
    raise WireError(f"batch entry {field['name']!r} has kind {kind!r}; {BATCH_FORMAT} knows "
                    "tensor, ndarray, str, bytes, json.")


def _bytes_of(column: pa.Array) -> tuple[pa.Buffer, int, int]:
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int64)
    start, stop = int(offsets[column.offset]), int(offsets[column.offset + 1])
    return column.buffers()[2] or pa.py_buffer(b""), start, stop


def decode_batch(record: pa.RecordBatch | pa.Table) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(batch, facts)`` of a record batch written by :func:`encode_batch`."""
    raw = (record.schema.metadata or {}).get(_META)
    if raw is None:
        raise WireError(f"the reply carries no {_META.decode()!r} metadata: not a "
                        f"{BATCH_FORMAT} batch (is the URL a stoker server?).")
    facts = json.loads(raw)
    if facts.get("format") != BATCH_FORMAT or record.num_rows != 1:
        raise WireError(f"reply format {facts.get('format')!r} with {record.num_rows} rows; "
                        f"this client reads {BATCH_FORMAT} (one row): upgrade client and "
                        "server together.")
    columns = record.columns if isinstance(record, pa.RecordBatch) else \
        [c.combine_chunks() for c in record.columns]
    batch = {f["name"]: _value(col, f) for f, col in zip(facts.pop("fields"), columns)}
    return batch, facts

