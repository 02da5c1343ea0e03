"""Digests of a batch's content as delivered, per column (``stoker.content/1``).

The ledger's id digests prove *which* samples a step consumed; these prove *what bytes* it
delivered. A worker computes them on the batch the source returned, before ``collate_fn`` and
``transform`` (the user's code), and the ledger records one u64 per column per step.
``stoker audit --dataset`` rebuilds every step's batch from the manifest's verified shards
through the plain pyarrow path (never the node's kernels, records or cache) and compares.

Digest of one column value (xxh3-64, streamed):

* a tensor or array: xxh3-64 of its bytes in C order (any dtype; bfloat16 read as raw bytes)
  with the seed xxh3-64(``"T{dtype}{shape}"``), e.g. ``"Ttorch.float32(1024, 64)"``; inside
  a mapping, tuple or ``_lengths`` pair that digest enters as 8 little-endian bytes;
* a list of ``bytes``/``str``/``None`` (binary and string columns): ``b"L"``, the lengths
  (int64, ``-1`` for ``None``), then the concatenated bytes (strings as UTF-8);
* anything else (a list of structs, a Python scalar): ``b"J"`` and its canonical JSON;
* a mapping or tuple (a generic dataset's collated batch): ``b"M"``/``b"S"`` then each
  entry's key and digest, in key order.

A list column that returns ``NAME_lengths`` beside ``NAME`` (rows of different lengths) is
digested together with it under ``NAME``.

Cost (bench/content_digest_bench.py): on a hot W1 batch, hashing proper takes ~8 us and
reading a tensor's dtype, shape and ``numpy()`` view ~3 us per column, so the fast path hands
:func:`batch_digests` the NumPy arrays behind its tensors (``arrays``), just written and
still in cache, and :func:`array_digest` hashes them with a seed cached per (dtype, shape).
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import xxhash

__all__ = ["CONTENT_ALGORITHM", "array_digest", "batch_digests", "content_header",
           "value_digest"]

CONTENT_ALGORITHM = "stoker.content/1"
_SHAPE = np.dtype("<i8")
_SEEDS: dict[tuple[Any, ...], int] = {}
_NUMPY_OK = frozenset((torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                       torch.float16, torch.float32, torch.float64))
# the tensor dtype torch.from_numpy gives each NumPy dtype, for array_digest's seed
_TORCH_OF = {np.dtype(torch.empty(0, dtype=d).numpy().dtype): d for d in _NUMPY_OK}
_ARRAY_SEEDS: dict[tuple[np.dtype, tuple[int, ...]], int] = {}
_xxh3 = xxhash.xxh3_64_intdigest


def _header_seed(kind: str, dtype: Any, shape: tuple[int, ...]) -> int:
    """The seed a tensor's bytes are hashed with: the xxh3 of ``"T{dtype}{shape}"`` (cached:
    a batch's columns keep their dtype and shape, and this saves a string per column)."""
    key = (kind, dtype, shape)
    seed = _SEEDS.get(key)
    if seed is None:
        if len(_SEEDS) > 4096:
            _SEEDS.clear()
        seed = _SEEDS[key] = xxhash.xxh3_64_intdigest(f"T{dtype}{shape}".encode())
    return seed


def _tensor_digest(t: torch.Tensor) -> int:
    """xxh3-64 of the tensor's bytes in C order, seeded with its dtype and shape. No copy for
    a contiguous CPU tensor (the fast path's batches); numpy's view is far cheaper than
    torch's reshape/view ops, which cost more than hashing a small column."""
    seed = _header_seed("T", t.dtype, tuple(t.shape))
    if not t.is_cpu:
        t = t.cpu()
    if t.requires_grad:
        t = t.detach()
    if t.dtype in _NUMPY_OK:
        a = t.numpy()
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
    else:  # bfloat16 and friends: raw bytes
        a = t.contiguous().reshape(-1).view(torch.uint8).numpy()
    return xxhash.xxh3_64_intdigest(a, seed=seed) if a.size else seed


def array_digest(a: np.ndarray) -> int:
    """``value_digest(torch.from_numpy(a))`` for a C-contiguous array, without the tensor:
    the fast path's outputs are such arrays, and its digests are computed on them right
    after the kernels wrote them. An array this cannot vouch for (not C-contiguous, a dtype
    torch does not share) goes through the tensor."""
    seed = _array_seed(a)
    if seed is None:
        return _tensor_digest(torch.from_numpy(a))
    return _xxh3(a, seed) if a.size else seed


def _array_seed(a: np.ndarray) -> int | None:
    """The tensor seed of a C-contiguous array of a dtype torch shares, cached per (dtype,
    shape); ``None`` for any other array."""
    if not a.flags.c_contiguous:
        return None
    key = (a.dtype, a.shape)
    seed = _ARRAY_SEEDS.get(key)
    if seed is None:
        torch_dtype = _TORCH_OF.get(a.dtype)
        if torch_dtype is None:
            return None
        if len(_ARRAY_SEEDS) > 4096:
            _ARRAY_SEEDS.clear()
        seed = _ARRAY_SEEDS[key] = _header_seed("T", torch_dtype, a.shape)
    return seed


def _array_digest(a: np.ndarray) -> int:
    seed = _header_seed("A", str(a.dtype), a.shape)
    return xxhash.xxh3_64_intdigest(np.ascontiguousarray(a), seed=seed) if a.size else seed


def _update(h: xxhash.xxh3_64, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        h.update(_tensor_digest(value).to_bytes(8, "little"))
    elif isinstance(value, np.ndarray):
        h.update(_array_digest(value).to_bytes(8, "little"))
    elif isinstance(value, Mapping):
        h.update(b"M")
        for key in sorted(value, key=str):
            h.update(str(key).encode() + b"\0")
            _update(h, value[key])
    elif isinstance(value, tuple):
        h.update(b"S")
        for item in value:
            _update(h, item)
    elif isinstance(value, list) and all(v is None or isinstance(v, (bytes, str))
                                         for v in value):
        raw = [v.encode() if isinstance(v, str) else v for v in value]
        lengths = np.array([-1 if v is None else len(v) for v in raw], dtype=_SHAPE)
        h.update(b"L" + lengths.tobytes())
        h.update(b"".join(v for v in raw if v is not None))
    else:
        h.update(b"J" + json.dumps(value, sort_keys=True, default=repr,
                                   separators=(",", ":")).encode())


def value_digest(value: Any, lengths: Any = None) -> int:
    """The digest of one column value (and its ``_lengths`` companion, if any)."""
    if lengths is None and isinstance(value, torch.Tensor):  # the common case, kept cheap
        return _tensor_digest(value)
    h = xxhash.xxh3_64()
    _update(h, value)
    if lengths is not None:
        h.update(b"+lengths")
        _update(h, lengths)
    return h.intdigest()


def batch_digests(batch: Any, columns: Sequence[str],
                  arrays: Mapping[str, np.ndarray] | None = None) -> list[int]:
    """One digest per name of ``columns`` (a generic batch is the single column ``"batch"``).

    ``arrays``: the C-contiguous NumPy arrays some of the batch's tensors are
    ``torch.from_numpy`` views of (the fast path's outputs, by batch key), hashed directly
    with :func:`array_digest`; the digests are the same as without them.
    """
    if arrays and type(batch) is dict and "batch" not in columns:  # the fast path's, kept cheap
        return _array_digests(batch, columns, arrays)
    if list(columns) == ["batch"] and not (isinstance(batch, Mapping) and "batch" in batch):
        return [value_digest(batch)]
    if not isinstance(batch, Mapping):
        raise TypeError(f"content digests: expected a dict batch with columns {list(columns)}, "
                        f"got {type(batch).__name__}")
    return [value_digest(batch[name], batch.get(f"{name}_lengths")) for name in columns]


def _array_digests(batch: dict[str, Any], columns: Sequence[str],
                   arrays: Mapping[str, np.ndarray]) -> list[int]:
    """:func:`batch_digests` with ``arrays``. Per column, the common case (an array whose
    seed is cached, no ``_lengths``) is inlined: a function call costs as much as hashing
    10 KB here, and a W1 batch's four columns are hashed in ~7 us."""
    out = []
    for name in columns:
        a = arrays.get(name)
        seed = None if a is None or name + "_lengths" in batch \
            else _ARRAY_SEEDS.get((a.dtype, a.shape))
        if seed is not None and a.size and a.flags.c_contiguous:
            out.append(_xxh3(a, seed))
        else:
            out.append(_column_digest(batch, name, arrays))
    return out


def _column_digest(batch: Mapping[str, Any], name: str, arrays: Mapping[str, np.ndarray]) -> int:
    """``value_digest`` of column ``name`` (and its ``_lengths``), from ``arrays`` where
    they hold it."""
    a = arrays.get(name)
    lengths_name = name + "_lengths"
    if lengths_name not in batch:
        return value_digest(batch[name]) if a is None else array_digest(a)
    if a is None or lengths_name not in arrays:
        return value_digest(batch[name], batch[lengths_name])
    h = xxhash.xxh3_64()  # as value_digest's _update: each part's digest, 8 bytes LE
    h.update(array_digest(a).to_bytes(8, "little"))
    h.update(b"+lengths")
    h.update(array_digest(arrays[lengths_name]).to_bytes(8, "little"))
    return h.intdigest()


def content_header(source: Any) -> dict[str, Any]:
    """What the ledger header records so an audit can rebuild a step's batch: the digested
    columns and, for a stoker dataset or a mixture of them, the read options that shape the
    batch (a mixture's readers share the loader's; its batches add ``"source"``)."""
    if getattr(source, "kind", None) == "mixture":  # stoker.loader.read.mixture
        content = content_header(source.readers[0])
        content["columns"].append("source")
        return content
    if getattr(source, "kind", None) != "stoker":
        return {"algorithm": CONTENT_ALGORITHM, "columns": ["batch"], "read": None}
    grouped = set(source.features) | set(source.categoricals)
    columns = (["features"] if source.features else []) + \
        (["categoricals"] if source.categoricals else []) + \
        [c for c in source.columns if c not in grouped]
    image = source.image
    read = {"columns": list(source.columns), "features": list(source.features),
            "categoricals": list(source.categoricals),
            "image": None if image is None else {
                "column": image.column, "size": list(image.size),
                "crop": None if image.crop is None else list(image.crop),
                "ratio": list(image.ratio), "flip": bool(image.flip),
                "normalize": None if image.normalize is None else [list(x) for x in
                                                                   image.normalize],
                "output": image.output}}
    return {"algorithm": CONTENT_ALGORITHM, "columns": columns, "read": read}
