"""The pyarrow path's batch: a taken Arrow table -> the batch dict of column name -> tensor.

:class:`~stoker.loader.read.arrow.ArrowSource` builds batches this way when the fast path
cannot (compressed shards, columns the kernels do not read); the result equals the fast path's
batch (same keys, dtypes and bytes), which the tests check for every column kind.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import torch

from stoker.loader.fastpath.convert import stack_features, table_to_batch
from stoker.loader.fastpath.images import ImageOptions, decode_into

__all__ = ["arrow_batch"]


def arrow_batch(table: pa.Table, ids: np.ndarray, features: Sequence[str],
                categoricals: Sequence[str], image: ImageOptions | None, fingerprint: str,
                epoch: int, seed: int) -> dict[str, Any]:
    """The batch of the rows ``table`` holds (sample ids ``ids``): ``features`` stacked into
    float32 ``[B, K]``, ``categoricals`` into int64 ``[B, C]``, the image column decoded
    (augmented from ``(fingerprint, seed, epoch, id)``), other columns converted (see
    :mod:`stoker.loader.fastpath.convert` for the rules)."""
    batch: dict[str, Any] = {}
    if image is not None:
        images = _images(image, table.column(image.column), ids, fingerprint, epoch, seed)
    if features:
        batch["features"] = stack_features(table, features)
        table = table.drop_columns(list(features))
    if categoricals:
        batch["categoricals"] = _stack_ints(table, categoricals)
        table = table.drop_columns(list(categoricals))
    converted = table_to_batch(table)
    if image is not None:
        converted[image.column] = images
    batch.update(converted)
    return batch


def _images(options: ImageOptions, column: pa.ChunkedArray, ids: np.ndarray, fingerprint: str,
            epoch: int, seed: int) -> torch.Tensor:
    """Decode a taken binary column into ``[B, H, W, 3]`` images."""
    blobs = [b or b"" for b in column.to_pylist()]
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in blobs])]).astype(np.int64)
    data = np.frombuffer(b"".join(blobs), dtype=np.uint8)
    out = np.empty((len(ids), *options.size, 3), dtype=options.dtype)
    decode_into(options, offsets, data, ids, out, fingerprint, seed, epoch)
    return torch.from_numpy(out)


def _stack_ints(table: pa.Table, columns: Sequence[str]) -> torch.Tensor:
    """Integer / dictionary columns -> int64 ``[B, C]`` (dictionary -> codes, nulls -> 0)."""
    out = np.empty((table.num_rows, len(columns)), dtype=np.int64)
    for j, name in enumerate(columns):
        out[:, j] = table_to_batch(table.select([name]))[name].numpy()
    return torch.from_numpy(out)
