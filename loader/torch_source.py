"""Batches of any map-style torch ``Dataset``: the generic path of the DataLoader.

The dataset is cut into virtual shards of ``VIRTUAL_SHARD`` samples, so the same order
machinery (shard permutation, block shuffle, partitions) applies unchanged.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from stoker.loader.errors import WorkerError
from stoker.manifest import hash_bytes

__all__ = ["VIRTUAL_SHARD", "TorchSource", "torch_fingerprint", "virtual_shard_rows"]

VIRTUAL_SHARD = 1024


def virtual_shard_rows(length: int) -> np.ndarray:
    """Rows of the virtual shards of a dataset of ``length`` samples."""
    full, rest = divmod(length, VIRTUAL_SHARD)
    rows = np.full(full + (rest > 0), VIRTUAL_SHARD, dtype=np.int64)
    if rest:
        rows[-1] = rest
    return rows


def torch_fingerprint(dataset: Any) -> str:
    """A stand-in fingerprint for a generic dataset: its class and length.

    A generic dataset has no content hash; two datasets of the same class and length get
    the same order for the same seed, which is what resuming a run needs.
    """
    cls = type(dataset)
    return hash_bytes(f"torch-dataset:{cls.__module__}.{cls.__qualname__}:{len(dataset)}".encode())


class TorchSource:
    """Fetches samples by index and collates them; errors name the failing index."""

    kind = "torch"

    def __init__(self, dataset: Any, collate_fn: Callable[[list[Any]], Any] | None,
                 batched: bool = True) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.batched = batched
        self.fingerprint = torch_fingerprint(dataset)
        self.shard_rows = virtual_shard_rows(len(dataset))
        self.opened_shards: set[int] = set()

    def _samples(self, ids: Sequence[int]) -> list[Any]:
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems is not None:
            return list(getitems(list(ids)))
        out = []
        for i in ids:
            try:
                out.append(self.dataset[i])
            except Exception as exc:
                raise WorkerError(f"dataset[{i}] ({type(self.dataset).__name__}) raised "
                                  f"{type(exc).__name__}: {exc}") from exc
        return out

    def fetch(self, ids: np.ndarray | Sequence[int]) -> Any:
        index = [int(i) for i in ids]
        if not self.batched:
            (i,) = index
            sample = self._samples([i])[0]
            return self.collate_fn(sample) if self.collate_fn else sample
        if not index and len(self.dataset):
            return self._empty_batch()
        samples = self._samples(index)
        return self.collate_fn(samples) if self.collate_fn else samples

    def _empty_batch(self) -> Any:
        """A batch of zero samples with the structure of a real one.

        A rank's share of the last global batch can be empty (see ``schedule.py``); every
        rank still takes the step, so collectives stay aligned. Collating needs a sample to
        know the structure: sample 0 is collated and every tensor cut to zero rows.
        """
        one = self.collate_fn([self.dataset[0]]) if self.collate_fn else []
        return _truncate(one)

    def close(self) -> None:
        """Nothing to release; present for symmetry with ArrowSource."""


def _truncate(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch[:0]
    if isinstance(batch, dict):
        return {k: _truncate(v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_truncate(v) for v in batch))
    if isinstance(batch, (list, tuple)):
        if batch and all(not isinstance(v, (torch.Tensor, dict, list, tuple)) for v in batch):
            return type(batch)()
        return type(batch)(_truncate(v) for v in batch)
    return batch
