"""Token files (``.npy`` or raw ``.bin`` of uint16/uint32) cut into fixed-length sequences.

Each row is one sequence: column ``tokens`` of type ``fixed_size_list<uint16|uint32>[seq_len]``
(the loader turns it into a ``[B, seq_len]`` tensor). ``.npy`` files carry their dtype (it must
be a 1-D uint16 or uint32 array; ``--token-dtype`` must agree when given); raw ``.bin`` files
have no header, so ``--token-dtype`` is required.

Tail rule: every file is cut on its own, from its first token, into ``n // seq_len``
sequences; the last ``n % seq_len`` tokens of each file do not fill a sequence and are not
stored. The manifest records it (``provenance.options``: ``token_tail: "drop"`` and
``dropped_tokens``, the total), and a warning names the count, so nothing is dropped silently.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from stoker.sharder.errors import ShardOptionsError, SharderError
from stoker.sharder.inputs import InputFile

__all__ = ["TOKEN_DTYPES", "TokenFile", "read_tokens", "scan_tokens", "token_count",
           "token_schema"]

TOKEN_DTYPES = ("uint16", "uint32")


@dataclass(frozen=True, slots=True)
class TokenFile(InputFile):
    """A token file with the dtype and sequence length it is cut with."""

    dtype: str = "uint16"
    seq_len: int = 1


def token_schema(dtype: str, seq_len: int) -> pa.Schema:
    return pa.schema([pa.field("tokens", pa.list_(pa.from_numpy_dtype(np.dtype(dtype)), seq_len),
                               False)])


def _array(path: str, dtype: str | None) -> np.ndarray:
    raw = not path.lower().endswith(".npy")
    if raw and dtype is None:
        raise ShardOptionsError(f"{path!r} is a raw token file without a header; pass "
                                "--token-dtype uint16 or uint32.")
    try:
        if not raw:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        else:
            size = os.path.getsize(path)
            if size % np.dtype(dtype).itemsize:
                raise SharderError(f"{path!r} is {size} bytes, not a multiple of {dtype}'s "
                                   f"{np.dtype(dtype).itemsize}; wrong --token-dtype or a "
                                   "truncated file.")
            arr = np.memmap(path, dtype=dtype, mode="r") if size else np.zeros(0, dtype)
    except (OSError, ValueError) as exc:
        raise SharderError(f"cannot read {path!r} as a token file ({type(exc).__name__}: "
                           f"{exc}); fix it or remove it from SRC.") from exc
    if arr.ndim != 1 or arr.dtype.name not in TOKEN_DTYPES:
        raise SharderError(f"{path!r} holds a {arr.dtype} array of shape {arr.shape}; token "
                           "files must be 1-D uint16 or uint32.")
    if dtype is not None and arr.dtype.name != dtype:
        raise SharderError(f"{path!r} holds {arr.dtype.name} tokens but --token-dtype is "
                           f"{dtype}; drop the option or convert the file.")
    return arr


def token_file(inp: InputFile, dtype: str | None, seq_len: int | None) -> TokenFile:
    """``inp`` with its resolved dtype and sequence length."""
    if seq_len is None:
        raise ShardOptionsError("token files need --seq-len N (tokens per sequence, e.g. 1024).")
    found = _array(inp.path, dtype).dtype.name
    return TokenFile(inp.path, inp.rel, "tokens", inp.bytes, inp.mtime_ns, (), found, seq_len)


def token_count(inp: TokenFile) -> int:
    return len(_array(inp.path, inp.dtype))


def scan_tokens(inp: TokenFile) -> tuple[int, pa.Schema]:
    """Sequences in the file and the schema."""
    return token_count(inp) // inp.seq_len, token_schema(inp.dtype, inp.seq_len)


def read_tokens(inp: TokenFile, start: int, stop: int) -> pa.Table:
    """Sequences ``[start, stop)`` of the file."""
    arr = _array(inp.path, inp.dtype)
    flat = np.array(arr[start * inp.seq_len:stop * inp.seq_len])
    tokens = pa.FixedSizeListArray.from_arrays(pa.array(flat), inp.seq_len)
    return pa.Table.from_arrays([tokens], schema=token_schema(inp.dtype, inp.seq_len))
