"""The working set: the most shards and bytes one rank needs live at once, computed, not hoped.

A shuffled epoch is read in *rounds*: round ``b`` is block ``b`` (``K`` consecutive elements of
the shard-permuted stream) of every partition, and all partitions enter block ``b`` at the same
global position (``O[k]`` is partition ``k % P``, element ``k // P``). A rank stages the rows of
its ``P / W`` blocks of a round into one row-major buffer (:mod:`stoker.loader.read.staging`) and
keeps :data:`STAGED_ROUNDS` rounds live (the one being read, the next being staged, one for a
batch that straddles two). So, whatever the dataset size:

- staged rows <= ``STAGED_ROUNDS x P/W x min(K, partition length)``, bytes = rows x record stride;
- shards live <= ``P/W x span(STAGED_ROUNDS x K)`` where ``span(L)`` is the most shards a run of
  ``L`` consecutive stream samples can cross (two partial ends plus the most whole shards whose
  rows fit in ``L``: the smallest shards first), and never more than the dataset's shards.

Both are pure functions of (shard sizes, order options, world size, record stride), so the
loader checks them against the node's budgets at construction and refuses, naming options that
fit, instead of thrashing (issue 12). Default partitions come from :func:`default_partitions`:
a function of the dataset and the per-rank batch size only, never of the world size, so a
state saved at one W resumes at any W that divides it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from stoker.loader.order.options import OrderOptions

__all__ = ["DEFAULT_BLOCK", "PARTITION_LADDER", "STAGED_ROUNDS", "STAGING_LIMIT", "WorkingSet",
           "default_partitions", "working_set"]

#: Candidate partition counts, largest first: highly divisible, so many world sizes divide them.
PARTITION_LADDER = (720, 360, 240, 120, 60, 24, 12, 6, 4, 2, 1)
#: Default block size ``K`` (samples): a round then copies runs of ~``K`` rows per partition.
DEFAULT_BLOCK = 1024
#: Rounds a rank keeps staged at once: the one read, the next (staged ahead), one straddled.
STAGED_ROUNDS = 3
#: Staging memory the default options are sized for (independent of the machine, so the
#: default order is the same on every node; a node with less memory is refused clearly).
STAGING_LIMIT = 1 << 30
#: Shards a cache holds beyond the working set: what its prefetcher fetches ahead. Measured
#: with 20-40 shards: one more gave 1.0-1.15x the dataset fetched per epoch, none 1.15-3.3x.
_AHEAD = 2


@dataclass(frozen=True, slots=True)
class WorkingSet:
    """What one rank needs live at once (upper bounds).

    Attributes:
        shards: distinct shards (each pinned in the cache while needed).
        shard_bytes: bytes of those shards plus the ones the cache fetches ahead (the largest
            ``shards + 2`` shards of the dataset): what a cache limit must hold so that no shard
            is fetched twice in an epoch.
        staged_rows: rows held in staging buffers.
        staging_bytes: ``staged_rows x stride`` (row-major record bytes per row).
    """

    shards: int
    shard_bytes: int
    staged_rows: int
    staging_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _span(sorted_rows: np.ndarray, length: int, partial: int = 2) -> int:
    """Most shards a run of ``length`` consecutive stream samples can intersect: the most
    whole shards that fit, plus ``partial`` cut ones (the run's two ends; in ``"fixed"``
    partition mode a partition's pieces are re-ordered, so its two boundary pieces, parts of
    shards, can sit inside the run too: 4)."""
    if length <= 0 or not len(sorted_rows):
        return 0
    whole = int(np.searchsorted(np.cumsum(sorted_rows), length, side="right"))
    return min(len(sorted_rows), whole + partial)


def working_set(shard_rows: np.ndarray, shard_bytes: np.ndarray, options: OrderOptions,
                world_size: int = 1, stride: int = 0, window: int = 0,
                readers: int = 1) -> WorkingSet:
    """The working set of one rank for resolved ``options`` (see the module docstring).

    Args:
        shard_rows, shard_bytes: per-shard sample counts and byte sizes (manifest order).
        options: resolved order options (``block_size`` filled in).
        world_size: ranks sharing the partitions.
        stride: bytes per staged row (0: nothing is staged).
        window: natural order only: global positions in flight at once (batches ahead x
            global batch); a shuffled order's window follows from its rounds.
        readers: processes that stage, pin and evict on their own (worker processes plus the
            loader's prefetching process; 1 for thread workers): each holds its own staging
            buffers and reads the rounds at its own pace, so both figures scale with them
            (measured: with 2 worker processes and the one-reader limit, 2.2-3x the dataset
            was fetched per epoch).
    """
    rows = np.asarray(shard_rows, dtype=np.int64)
    sizes = np.asarray(shard_bytes, dtype=np.int64)
    nonempty = np.sort(rows[rows > 0])
    largest = np.sort(sizes[rows > 0])[::-1]
    total = int(rows.sum())
    if not options.shuffle:
        span = min(len(nonempty), readers * _span(nonempty, max(window, 1)))
        return WorkingSet(span, int(largest[:span + 1].sum()), 0, 0)  # one fetched ahead
    P, K = options.partitions, options.block_size
    owned = -(-P // world_size)
    per_partition = min(K, -(-total // P)) if total else 0
    partial = 4 if options.partition_mode == "fixed" else 2
    shards = min(len(nonempty), readers * owned * _span(nonempty, STAGED_ROUNDS * K, partial))
    staged = readers * min(STAGED_ROUNDS * owned * per_partition, total)
    return WorkingSet(shards, int(largest[:shards + _AHEAD].sum()), staged, staged * stride)


def default_partitions(shard_rows: np.ndarray, shard_bytes: np.ndarray, stride: int,
                       cache_limit: int | None = None,
                       block_size: int = DEFAULT_BLOCK,
                       staging_limit: int = STAGING_LIMIT, readers: int = 1) -> int:
    """The default partition count: the largest of :data:`PARTITION_LADDER` whose working
    set at world size 1 (the worst case: every other W needs less per rank) fits the staging
    limit and, for a cached dataset, ``cache_limit``; 1 when nothing else fits. At most
    ``max(24, N // block_size)``: partitions shorter than a block would leave samples of one
    shard next to each other (a small dataset gets 24: one block each, shuffled whole, and
    world sizes 1, 2, 3, 4, 6, 8, 12, 24). Independent of the world size and of the batch
    size (either may change on an elastic resume while the global batch stays the same)."""
    cap = max(24, int(np.sum(shard_rows)) // max(1, block_size))
    for P in PARTITION_LADDER:
        if P > cap:
            continue
        opts = OrderOptions(partitions=P, block_size=block_size)
        ws = working_set(shard_rows, shard_bytes, opts, 1, stride, readers=readers)
        if ws.staging_bytes <= staging_limit and (cache_limit is None
                                                  or ws.shard_bytes <= cache_limit):
            return P
    return 1
