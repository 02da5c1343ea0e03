"""One node cache budget for a whole mixture: each cached source gets a share of the limit.

A mixture reads each source that cannot share a reader (a remote one) through its own shard
cache, and a :class:`~stoker.cache.ShardCache`'s ``limit`` bounds that one dataset; given the
same ``CacheOptions(limit=...)`` each, three remote sources could fill three times the disk the
user allowed. So the limit is split once, at construction (issue 17, "each source's working
set counts against the node's budget"):

- every cached source first gets its working set (the most shard bytes its order needs live
  at once, :func:`stoker.loader.order.working_set.working_set`): less and it would fetch
  shards again within an epoch;
- what is left goes to the sources in proportion to what each still lacks to hold all its
  shards (its size minus its working set), never more than that: a small source that is
  blended many times is then kept whole when the limit allows, a terabyte source takes the
  rest;
- when the working sets alone exceed the limit, construction fails with a
  :class:`~stoker.loader.read.order_plan.WorkingSetError` naming every source's figure.

The shares depend only on the manifests, the order options and the limit: every process and
every run of the same job splits the budget the same way.

Sources that share one reader stage their rounds each on their own
(:mod:`stoker.loader.read.mixture_staging`), so the mixture's staging memory is the sum of the
sources' working sets, and :func:`mixture_plan` sizes the default partitions for that sum, as
:func:`~stoker.loader.order.working_set.default_partitions` does for one dataset (whether or
not this node stages: the order must not depend on the machine).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from stoker.loader.fastpath.rowmajor import _physical_memory
from stoker.loader.order.mixture_order import source_options
from stoker.loader.order.options import OrderOptions
from stoker.loader.order.working_set import (PARTITION_LADDER, STAGING_LIMIT, WorkingSet,
                                             working_set)
from stoker.loader.read.order_plan import OrderPlan, WorkingSetError
from stoker.manifest import Manifest

__all__ = ["mixture_plan", "mixture_working_set", "split_cache_limit"]


def mixture_working_set(manifests: Sequence[Manifest], options: OrderOptions, stride: int,
                        readers: int = 1) -> WorkingSet:
    """The working set of one rank of a mixture whose sources stage their rounds each on their
    own: the sum of the sources' (their rounds are live at once, each source at its own pace),
    each at world size 1 whatever the ranks (a rank's picks of a source fall in every
    partition, stoker.loader.read.mixture_staging)."""
    sets = _each(manifests, options, stride, readers)
    return WorkingSet(*(sum(getattr(w, f) for w in sets) for f in
                        ("shards", "shard_bytes", "staged_rows", "staging_bytes")))


def mixture_plan(manifests: Sequence[Manifest], names: Sequence[str], plan: OrderPlan, *,
                 partitions: int | None, world_size: int, readers: int = 1,
                 memory: int | None = None) -> OrderPlan:
    """The order plan of a shuffled mixture whose sources share one reader (``plan``: that
    reader's own). Default partitions: the largest of the ladder, at most ``plan``'s, whose
    summed staging fits :data:`~stoker.loader.order.working_set.STAGING_LIMIT`.

    Raises:
        WorkingSetError: the summed staging exceeds ``memory`` (a quarter of physical memory);
            names each source's share and partitions that fit.
    """
    options = plan.options
    if not options.shuffle:
        return plan
    memory = (_physical_memory() or 1 << 40) // 4 if memory is None else memory
    rows = np.concatenate([m.shard_rows for m in manifests]).astype(np.int64)

    def total(P: int) -> WorkingSet:
        opts = OrderOptions(partitions=P, block_size=options.block_size,
                            partition_mode=options.partition_mode)
        return mixture_working_set(manifests, opts, plan.stride, readers)

    if partitions is None:
        cap = min(options.partitions, max(24, int(rows.sum()) // max(1, options.block_size)))
        partitions = next((P for P in PARTITION_LADDER if P <= cap
                           and total(P).staging_bytes <= STAGING_LIMIT), 1)
    options = OrderOptions(shuffle=True, partitions=partitions, block_size=options.block_size,
                           partition_mode=options.partition_mode).resolve(rows)
    ws = total(options.partitions)
    if ws.staging_bytes > memory:
        each = ", ".join(f"{n}: {w.staging_bytes} B" for n, w in
                         zip(names, _each(manifests, options, plan.stride, readers)))
        fit = next((P for P in PARTITION_LADDER if P < options.partitions
                    and P % world_size == 0
                    and total(P).staging_bytes <= memory), None)
        raise WorkingSetError(
            f"the mixture's working set does not fit this node: its sources stage "
            f"{ws.staging_bytes} B at once ({each}) > {memory} B (a quarter of this node's "
            f"memory) (ShuffleOptions(partitions={options.partitions}, block_size="
            f"{options.block_size}), world_size={world_size}). "
            + (f"ShuffleOptions(partitions={fit}) fits." if fit is not None else
               "Lower block_size, or use fewer sources."))
    return OrderPlan(options, ws, plan.stride)


def _each(manifests: Sequence[Manifest], options: OrderOptions, stride: int,
          readers: int) -> list[WorkingSet]:
    each = source_options(options, [int(np.sum(m.shard_rows)) for m in manifests])
    return [working_set(m.shard_rows, m.shard_bytes, opts.resolve(m.shard_rows), 1, stride,
                        readers=readers) for m, opts in zip(manifests, each)]


def split_cache_limit(limit: int, needs: Sequence[int], sizes: Sequence[int],
                      names: Sequence[str]) -> list[int]:
    """Each source's share of ``limit`` (bytes), in the order given.

    Args:
        limit: the node cache's byte limit for the whole mixture.
        needs: each source's working set in bytes (the least it may get).
        sizes: each source's shard bytes in total (the most it can use).
        names: the sources' names, for the error.

    Raises:
        WorkingSetError: the working sets together exceed ``limit``.
    """
    total = sum(needs)
    if total > limit:
        each = ", ".join(f"{n}: {b} B" for n, b in zip(names, needs))
        raise WorkingSetError(
            f"the mixture's cached sources need {total} B of shards live at once ({each}) but "
            f"the cache limit is {limit} B for all of them together; raise "
            f"CacheOptions(limit=...) to at least {total} B, or use fewer partitions "
            f"(ShuffleOptions(partitions=...)) so that each source's working set shrinks")
    lacking = [max(0, size - need) for need, size in zip(needs, sizes)]
    left = limit - total
    wanted = sum(lacking)
    if wanted <= left:
        return [need + lack for need, lack in zip(needs, lacking)]
    return [need + left * lack // wanted for need, lack in zip(needs, lacking)]
