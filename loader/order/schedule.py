"""Batch geometry: which global positions a rank consumes at each step of an epoch.

The order (``stoker.loader.order.epoch.EpochOrder``) says which sample sits at global position k;
the schedule cuts positions into global batches of ``global_batch`` and gives rank r of W the
positions k with ``k % W == r`` inside each batch. Because W divides the partition count P,
that is the same as "rank r owns the partitions p with p % W == r", and the union over ranks
of a step's batches is the global batch whatever W is.

Tail rule (documented for users): with ``drop_last=False`` every rank takes
``ceil(N / G)`` steps; in the last step rank r gets its share of the remainder, which can be
empty when the remainder is smaller than W, so all ranks still take the same number of steps.
With ``drop_last=True`` every rank takes ``N // G`` steps and the remainder is not read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from stoker.loader.order.epoch import EpochOrder
from stoker.loader.order.windows import Ahead

__all__ = ["BatchPlan", "batch_ids", "rank_batch_ids"]


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """The batch geometry of one rank: pure data, validated on construction."""

    num_samples: int
    global_batch: int
    world_size: int = 1
    rank: int = 0
    drop_last: bool = False

    def __post_init__(self) -> None:
        if self.num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {self.num_samples}")
        if self.global_batch < 1:
            raise ValueError(f"global batch size must be >= 1, got {self.global_batch}; "
                             "pass batch_size >= 1")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must satisfy 0 <= rank < world_size, got rank={self.rank} "
                             f"world_size={self.world_size}")

    @property
    def steps_per_epoch(self) -> int:
        if self.drop_last:
            return self.num_samples // self.global_batch
        return -(-self.num_samples // self.global_batch)

    def window(self, step: int) -> tuple[int, int]:
        """Global positions ``[start, stop)`` of the global batch at ``step``."""
        if not 0 <= step < self.steps_per_epoch:
            raise IndexError(f"step {step} outside the epoch's {self.steps_per_epoch} steps")
        start = step * self.global_batch
        return start, min(start + self.global_batch, self.num_samples)

    def rank_positions(self, step: int) -> tuple[int, int]:
        """This rank's positions in ``step`` as ``range(first, stop, world_size)`` bounds."""
        start, stop = self.window(step)
        first = start + (self.rank - start) % self.world_size
        return first, stop

    def samples_before(self, step: int) -> int:
        """How many samples this rank consumes in steps ``[0, step)`` of an epoch."""
        if step <= 0:
            return 0
        stop = min(step * self.global_batch, self.num_samples)
        return max(0, -(-(stop - self.rank) // self.world_size))


def rank_batch_ids(order: EpochOrder, plan: BatchPlan, step: int) -> np.ndarray:
    """Global sample ids this rank consumes at ``step``, in order (int64)."""
    start, stop = plan.window(step)
    return order.rank_ids(start, stop, plan.rank, plan.world_size)


def batch_ids(order: EpochOrder, plan: BatchPlan,
              ahead: Ahead | None = None) -> Callable[[int], np.ndarray]:
    """``step -> rank_batch_ids(order, plan, step)`` for a loader's pass, which asks for
    consecutive steps: the ids come from the order's :meth:`~EpochOrder.windows` (chunks of
    positions computed at once; the next ones by ``ahead``, when given)."""
    windows = order.windows(ahead)

    def ids(step: int) -> np.ndarray:
        start, stop = plan.window(step)
        return windows.rank_ids(start, stop, plan.rank, plan.world_size)  # type: ignore[no-any-return]

    return ids
