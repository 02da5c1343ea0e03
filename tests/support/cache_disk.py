"""What a shard cache's directory holds on disk, as any reader of the disk sees it.

Tests that bound a cache's disk use measure it here, independently of the cache's own
accounting (:mod:`stoker.cache.store.budget`).
"""

from __future__ import annotations

import os

__all__ = ["disk_use"]


def disk_use(directory: str | os.PathLike[str]) -> tuple[int, int]:
    """(committed bytes, committed + in-flight bytes) of the dataset cache ``directory``:
    ``shards/`` and ``quarantine/`` are committed, ``tmp/`` is in flight. Files that vanish
    while being listed (evicted meanwhile) and folders not made yet count as empty."""
    committed = inflight = 0
    for sub in ("shards", "quarantine", "tmp"):
        try:
            entries = list(os.scandir(os.path.join(directory, sub)))
        except FileNotFoundError:
            continue
        for entry in entries:
            try:
                n = entry.stat().st_size
            except FileNotFoundError:
                continue
            if sub == "tmp":
                inflight += n
            else:
                committed += n
    return committed, committed + inflight
