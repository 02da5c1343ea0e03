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
"""

from __future__ import annotations

from typing import Sequence

from stoker.loader.read.order_plan import WorkingSetError

__all__ = ["split_cache_limit"]


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
