"""Typed errors of the sharder: every message names the thing, the value and the fix."""

from __future__ import annotations

from stoker.manifest import StokerError

__all__ = ["ShardOptionsError", "SharderError"]


class SharderError(StokerError):
    """Sharding cannot go on: a source is missing or bad, or the destination is unusable.

    Raised before anything is lost: a failed run leaves no manifest and no temp files, and
    shards already finished stay in place so that the next run resumes from them.
    """


class ShardOptionsError(SharderError, ValueError):
    """The options contradict each other or have an invalid value (bad usage, CLI exit 2)."""
