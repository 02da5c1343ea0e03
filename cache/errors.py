"""Typed errors of the shard cache; messages name the shard, the (redacted) URL and the fix."""

from __future__ import annotations

from stoker.manifest import StokerError

__all__ = ["CacheError", "CacheLimitError", "RemoteFetchError"]


class CacheError(StokerError):
    """Base class of the errors :mod:`stoker.cache` raises on purpose."""


class CacheLimitError(CacheError, ValueError):
    """The byte budget (``limit``) or the in-flight allowance is too small to make progress."""


class RemoteFetchError(CacheError, OSError):
    """A shard could not be downloaded: a permanent refusal (401/403/404/410) or retries exhausted.

    Attributes:
        shard: the shard's path inside the dataset.
        url: the shard's location with credentials removed.
        status: the last HTTP status seen, or ``None`` (network error, non-HTTP backend).
        attempts: how many requests were made before giving up.
    """

    def __init__(self, message: str, *, shard: str, url: str, status: int | None = None,
                 attempts: int = 1) -> None:
        super().__init__(message)
        self.shard = shard
        self.url = url
        self.status = status
        self.attempts = attempts

    def __str__(self) -> str:  # OSError would otherwise format its args differently
        return str(self.args[0])
