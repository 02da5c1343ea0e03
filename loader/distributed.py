"""Rank and world size, resolved when iteration starts (after the process group exists).

Launchers build the loader at different times: Lightning's launching process builds it
before ``init_process_group``, the processes it starts have ``WORLD_SIZE`` and ``LOCAL_RANK``
but no ``RANK``. Resolving once, at construction, let two ranks disagree on the step count
and DDP wait forever; resolving at ``iter()`` (and at ``len()`` / ``state_dict()`` before
that) sees what the training loop sees.
"""

from __future__ import annotations

import os

import torch

from stoker.loader.errors import LoaderError

__all__ = ["WorldError", "env_world", "process_group_world", "resolve_world"]


class WorldError(LoaderError, ValueError):
    """Rank and world size are invalid or disagree with torch.distributed's process group."""


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise WorldError(f"environment variable {name}={raw!r} is not an integer; fix the "
                         "launcher's environment or pass rank= and world_size=.") from None


def process_group_world() -> tuple[int, int] | None:
    """``(rank, world_size)`` of torch.distributed's default process group, if one exists."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def env_world() -> tuple[int, int]:
    """``(rank, world_size)`` from the launcher's environment, else ``(0, 1)``.

    ``RANK``; else ``LOCAL_RANK`` plus ``NODE_RANK * LOCAL_WORLD_SIZE`` (what Lightning's and
    torchrun's launchers set); ``WORLD_SIZE``.
    """
    world = _env_int("WORLD_SIZE") or 1
    rank = _env_int("RANK")
    if rank is None:
        local, node = _env_int("LOCAL_RANK"), _env_int("NODE_RANK") or 0
        per_node = _env_int("LOCAL_WORLD_SIZE")
        if node and per_node is None:
            raise WorldError(f"NODE_RANK={node} and LOCAL_RANK={local} are set but neither RANK "
                             "nor LOCAL_WORLD_SIZE, so the global rank is unknown; set RANK (or "
                             "LOCAL_WORLD_SIZE), or pass rank= and world_size=.")
        rank = (local or 0) + node * (per_node or 0)
    return rank, world


def resolve_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: explicit, else torch.distributed, else the environment.

    Explicit values that disagree with an existing process group are refused: ranks that
    disagree on the world size read different step counts and a collective waits forever.
    """
    group = process_group_world()
    auto = group if group is not None else env_world() if rank is None or world_size is None \
        else (0, 1)
    got = (auto[0] if rank is None else rank, auto[1] if world_size is None else world_size)
    for name, value in (("rank", got[0]), ("world_size", got[1])):
        if isinstance(value, bool) or not isinstance(value, int):
            raise WorldError(f"{name} must be an int, got {value!r}")
    if got[1] < 1 or not 0 <= got[0] < got[1]:
        raise WorldError(f"rank must satisfy 0 <= rank < world_size, got rank={got[0]}, "
                         f"world_size={got[1]}")
    if group is not None and got != group:
        raise WorldError(f"this loader was given rank={got[0]}, world_size={got[1]}, but "
                         f"torch.distributed's process group is rank {group[0]} of {group[1]}: "
                         "the ranks would read different step counts (or the same samples) and "
                         "training would hang or repeat data. Drop rank= and world_size= (they "
                         "are taken from the process group when iteration starts) or pass the "
                         "group's values.")
    return got
