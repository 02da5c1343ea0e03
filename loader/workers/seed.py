"""Where the seed comes from when the user does not say (never silently), and the workers'
base seed derived from it (rank and world size: ``stoker.loader.distributed``)."""

from __future__ import annotations

import struct

import torch
import xxhash

__all__ = ["resolve_seed", "worker_base_seed"]

_MAX_SEED = 2**63 - 1


def resolve_seed(seed: int | None, generator: torch.Generator | None) -> int:
    """The seed to use: ``seed``, else one drawn from ``generator``, else from torch's RNG.

    The draw is the one ``torch.utils.data.RandomSampler`` makes, so ``torch.manual_seed``
    users stay reproducible. The result is recorded in ``state_dict()`` and the ledger.
    """
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MAX_SEED:
            raise ValueError(f"seed must be an int in [0, 2**63-1], got {seed!r}")
        return seed
    drawn = torch.empty((), dtype=torch.int64).random_(generator=generator).item()
    return int(drawn)


def worker_base_seed(seed: int, epoch: int) -> int:
    """torch's ``base_seed`` for the workers started in ``epoch``: torch draws it from the
    global RNG at every ``iter()``; stoker derives it, so ``get_worker_info().seed`` and the
    workers' initial RNG state are the same on every run."""
    digest = xxhash.xxh3_64_intdigest(struct.pack("<qq", seed, epoch) + b"worker-base-seed")
    return digest & _MAX_SEED
