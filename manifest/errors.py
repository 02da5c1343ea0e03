"""Typed exceptions shared by every stoker package.

They live in ``stoker.manifest`` because it is the one package everything else imports;
each message names the thing, the value received and the fix.
"""

from __future__ import annotations

__all__ = ["ManifestError", "ShardIntegrityError", "StokerError"]


class StokerError(Exception):
    """Base class of every error stoker raises on purpose."""


class ManifestError(StokerError, ValueError):
    """A manifest is missing, unreadable or violates the stoker/1 format.

    Attributes:
        field: dotted path of the offending field (``"shards[3].rows"``), or ``None``.
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ShardIntegrityError(StokerError):
    """A shard's bytes do not match what its manifest promises (size or xxh3-128)."""

    def __init__(self, message: str, shard: str | None = None) -> None:
        super().__init__(message)
        self.shard = shard
