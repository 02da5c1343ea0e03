"""Batches of any map-style torch ``Dataset``: the generic path of the DataLoader.

The dataset is cut into virtual shards of ``VIRTUAL_SHARD`` samples, so the same order
machinery (shard permutation, block shuffle, partitions) applies unchanged.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from stoker.loader.workers.failure import add_note
from stoker.loader.workers.sample_rng import batch_seed, sample_seed
from stoker.loader.workers.info import UserCall, user_code
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
    """Fetches samples by index and collates them, as a torch worker would.

    Each ``dataset[i]`` runs with the generators seeded from ``(seed, epoch, i)`` (see
    ``stoker.loader.workers.sample_rng``) unless ``seeding`` is off; an exception from the dataset
    keeps its type and gets a note naming the sample.
    """

    kind = "torch"

    def __init__(self, dataset: Any, collate_fn: Callable[[Any], Any] | None,
                 batched: bool = True, seeding: bool = True) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.batched = batched
        self.seeding = seeding
        self.fingerprint = torch_fingerprint(dataset)
        self.shard_rows = virtual_shard_rows(len(dataset))
        self.opened_shards: set[int] = set()

    def _get(self, index: Any, call: UserCall, seed: int, epoch: int) -> Any:
        call.seed(sample_seed(seed, epoch, index))
        try:
            return self.dataset[index]
        except Exception as exc:
            add_note(exc, f"(raised by {type(self.dataset).__name__}[{index!r}], sample "
                          f"{index!r} of epoch {epoch})")
            raise

    def _samples(self, ids: Sequence[int], call: UserCall, seed: int, epoch: int) -> list[Any]:
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems is None:
            return [self._get(i, call, seed, epoch) for i in ids]
        call.seed(batch_seed(seed, epoch, ids))
        try:
            return list(getitems(list(ids)))
        except Exception as exc:
            add_note(exc, f"(raised by {type(self.dataset).__name__}.__getitems__ for samples "
                          f"{list(ids)[:16]}{' ...' if len(ids) > 16 else ''} of epoch {epoch})")
            raise

    def fetch(self, ids: Any, epoch: int = 0, seed: int = 0) -> Any:
        """The batch of ``ids`` (an index array; without auto-collation the sampler's item,
        passed to ``dataset[...]`` as it is, as torch does)."""
        with user_code(self.seeding) as call:
            if not self.batched:
                index = ids
                if isinstance(ids, np.ndarray):
                    index = int(ids[0]) if ids.size == 1 else ids.tolist()
                sample = self._get(index, call, seed, epoch)
                return self.collate_fn(sample) if self.collate_fn else sample
            index = [int(i) for i in ids]
            if not index and len(self.dataset):
                return self._empty_batch()
            samples = self._samples(index, call, seed, epoch)
            if not self.collate_fn:
                return samples
            call.seed(batch_seed(seed, epoch, index))
            return self.collate_fn(samples)

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
