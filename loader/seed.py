"""Where the seed and the rank come from when the user does not say (never silently)."""

from __future__ import annotations

import os

import torch

__all__ = ["resolve_seed", "resolve_world"]

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


def resolve_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: explicit, else torch.distributed, else RANK/WORLD_SIZE, else (0, 1)."""
    if rank is None or world_size is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            auto = (dist.get_rank(), dist.get_world_size())
        else:
            auto = (int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)))
        rank = auto[0] if rank is None else rank
        world_size = auto[1] if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must satisfy 0 <= rank < world_size, got rank={rank}, "
                         f"world_size={world_size}")
    return rank, world_size
