"""The loader's known future: for each shard, when it is needed next (Belady's oracle).

The loader hands the cache the sequence of shard indices it will read; a cursor marks how far
it has got. ``next_use(s)`` is the first position of ``s`` at or after the cursor (infinity if
never), which is all that Belady's optimal eviction and ahead-of-need prefetching require.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["FutureIndex"]


class FutureIndex:
    """Positions of every shard in a future sequence, with a cursor; O(log n) per query."""

    __slots__ = ("_bounds", "_order", "_seq", "cursor")

    def __init__(self, upcoming: Sequence[int] | np.ndarray, num_shards: int) -> None:
        seq = np.asarray(upcoming, dtype=np.int64).reshape(-1)
        if seq.size and (seq.min() < 0 or seq.max() >= num_shards):
            bad = int(seq[(seq < 0) | (seq >= num_shards)][0])
            raise ValueError(f"set_future: shard index {bad} is out of range for a dataset of "
                             f"{num_shards} shards; pass manifest indices in [0, {num_shards}).")
        self._seq = seq
        self._order = np.argsort(seq, kind="stable")  # positions grouped by shard, ascending
        self._bounds = np.searchsorted(seq[self._order], np.arange(num_shards + 1))
        self.cursor = 0

    def __len__(self) -> int:
        return int(self._seq.size)

    def next_use(self, shard: int) -> float:
        """Position of the next read of ``shard`` at or after the cursor, or ``inf``."""
        positions = self._order[self._bounds[shard]:self._bounds[shard + 1]]
        k = int(np.searchsorted(positions, self.cursor))
        return float(positions[k]) if k < positions.size else math.inf

    def advance(self, shard: int, window: int) -> None:
        """Move the cursor past the next read of ``shard`` if it lies within ``window``."""
        p = self.next_use(shard)
        if p < self.cursor + window:
            self.cursor = int(p) + 1

    def upcoming(self, count: int) -> list[int]:
        """Up to ``count`` distinct shards in the order they are next needed."""
        out: list[int] = []
        seen: set[int] = set()
        start = self.cursor
        while len(out) < count and start < self._seq.size:
            for s in self._seq[start:start + 4 * count].tolist():
                if s not in seen:
                    seen.add(s)
                    out.append(s)
                    if len(out) == count:
                        break
            start += 4 * count
        return out
