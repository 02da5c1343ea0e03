"""The loader's known future: for each shard, when it is needed next (Belady's oracle).

The loader hands the cache the whole sequence of shard *uses* it will make, repeats included
(a shard read early in the epoch and again late is two uses), and a cursor marks how far it
has got. ``next_use(s)`` is all that Belady's optimal eviction and ahead-of-need prefetching
require: the time of ``s``'s next use at or after the cursor (infinity if never).

Two clocks:

* *Timed* (``spans`` given, what the loader passes): each use has a ``[first, last]`` span in
  order positions and the loader moves the cursor with :meth:`FutureIndex.advance_to` as it
  consumes batches. A shard inside a use is needed *now*; otherwise its next use starts at
  ``first``. Reads do not move this clock, so a shard re-opened within one use never skips
  the cursor past the uses of other shards.
* *Positional* (no spans): each entry is one read, its position its time, and reading a
  shard moves the cursor past its next scheduled read (:meth:`FutureIndex.advance`).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["FutureIndex"]


class FutureIndex:
    """Uses of every shard in a future sequence, with a cursor; O(log n) per query."""

    __slots__ = ("_bounds", "_firsts", "_lasts", "_order", "_seq", "cursor", "timed")

    def __init__(self, upcoming: Sequence[int] | np.ndarray, num_shards: int,
                 spans: np.ndarray | None = None) -> None:
        seq = np.asarray(upcoming, dtype=np.int64).reshape(-1)
        if seq.size and (seq.min() < 0 or seq.max() >= num_shards):
            bad = int(seq[(seq < 0) | (seq >= num_shards)][0])
            raise ValueError(f"set_future: shard index {bad} is out of range for a dataset of "
                             f"{num_shards} shards; pass manifest indices in [0, {num_shards}).")
        self.timed = spans is not None
        if spans is None:
            firsts = lasts = np.arange(seq.size, dtype=np.int64)
        else:
            spans = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
            if len(spans) != seq.size or (spans[:, 1] < spans[:, 0]).any() \
                    or (np.diff(spans[:, 0]) < 0).any():
                raise ValueError("set_future: spans must be one [first, last] pair per use, "
                                 "first <= last, sorted by first.")
            firsts, lasts = spans[:, 0].copy(), spans[:, 1].copy()
        self._seq, self._firsts, self._lasts = seq, firsts, lasts
        self._order = np.argsort(seq, kind="stable")  # uses grouped by shard, in time order
        self._bounds = np.searchsorted(seq[self._order], np.arange(num_shards + 1))
        self.cursor = 0 if spans is None or not seq.size else int(firsts[0])

    def __len__(self) -> int:
        return int(self._seq.size)

    def next_use(self, shard: int) -> float:
        """When ``shard`` is needed next at or after the cursor (the cursor itself while it
        is inside one of its uses), or ``inf``."""
        uses = self._order[self._bounds[shard]:self._bounds[shard + 1]]
        if not self.timed:
            k = int(np.searchsorted(uses, self.cursor))
            return float(uses[k]) if k < uses.size else math.inf
        live = uses[self._lasts[uses] >= self.cursor]
        return float(max(int(self._firsts[live[0]]), self.cursor)) if live.size else math.inf

    def advance(self, shard: int, window: int) -> None:
        """Positional clock: move past the next read of ``shard`` if it lies within ``window``.
        (A timed future moves only with :meth:`advance_to`.)"""
        if self.timed:
            return
        p = self.next_use(shard)
        if p < self.cursor + window:
            self.cursor = int(p) + 1

    def advance_to(self, position: int) -> None:
        """Timed clock: the reader has got to order position ``position`` (never backwards)."""
        self.cursor = max(self.cursor, int(position))

    def upcoming(self, count: int) -> list[int]:
        """Up to ``count`` distinct shards in the order they are next needed."""
        out: list[int] = []
        seen: set[int] = set()
        if self.timed:  # uses not finished yet, by start: those in progress come first
            start = int(np.searchsorted(self._firsts, self.cursor, side="right"))
            live = np.flatnonzero(self._lasts[:start] >= self.cursor)
            candidates = np.concatenate([live, np.arange(start, self._seq.size)])
            pos, step = 0, 4 * count
            while len(out) < count and pos < candidates.size:
                for s in self._seq[candidates[pos:pos + step]].tolist():
                    if s not in seen:
                        seen.add(s)
                        out.append(s)
                        if len(out) == count:
                            break
                pos += step
            return out
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
