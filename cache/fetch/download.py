"""One shard download into an open temp file, with capped, jittered retries.

A :class:`Fetcher` makes one request per :meth:`~Fetcher.attempt` and raises one of the
private outcome exceptions below; :func:`download` owns the retry policy, so every backend
(HTTP, fsspec, local files) obeys the same rules: resume from the bytes already written,
restart from zero when the object changed or the server ignored ``Range``, never retry a
permanent refusal.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import BinaryIO, Protocol

import xxhash

from stoker.cache.errors import CacheError, RemoteFetchError
from stoker.cache.fetch.retry import RetryPolicy
from stoker.cache.stats import _Counters

__all__ = ["Fetcher", "download"]

log = logging.getLogger("stoker.cache")


class Transient(Exception):
    """A failure worth retrying (reset, stall, truncation, 429, 5xx)."""

    def __init__(self, reason: str, *, status: int | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.retry_after = retry_after


class Fatal(Exception):
    """A permanent refusal (401, 403, 404, 410, unknown status): never retried."""

    def __init__(self, reason: str, *, status: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


class Mismatch(Exception):
    """The remote object is not what the manifest describes (size): an integrity failure."""


class Job:
    """State of one download: where the bytes go and what the server said about the object.

    Attributes:
        url: the real location (may hold credentials; never put it in a message).
        shown: ``url`` with credentials removed, for messages.
        shard: the shard's path in the manifest.
        size: the byte count the manifest promises.
        offset: bytes already written to ``file`` (the resume point).
        etag: validator of the object the written bytes came from, or ``None``.
    """

    __slots__ = ("_counters", "_stop", "etag", "file", "hasher", "offset", "received", "shard",
                 "shown", "size", "url")

    def __init__(self, url: str, shown: str, shard: str, size: int, file: BinaryIO,
                 counters: _Counters, stop: threading.Event | None = None) -> None:
        self.url, self.shown, self.shard, self.size, self.file = url, shown, shard, size, file
        self._counters = counters
        self._stop = stop
        self.hasher = xxhash.xxh3_128()  # of the bytes in ``file``, so nothing is re-read
        self.offset = 0
        self.received = 0
        self.etag: str | None = None

    def write(self, data: bytes) -> None:
        """Append received bytes; local disk errors are not network errors and are not retried."""
        if self._stop is not None and self._stop.is_set():
            raise CacheError(f"shard {self.shard!r}: download cancelled (cache closed).")
        try:
            self.file.write(data)
        except OSError as exc:
            raise CacheError(f"shard {self.shard!r}: cannot write the download to local disk "
                             f"({type(exc).__name__}: {exc.strerror}). Free space or choose "
                             "another cache_dir.") from None
        self.hasher.update(data)
        self.offset += len(data)
        self.received += len(data)
        self._counters.add("bytes_fetched", len(data))

    def restart(self, reason: str) -> None:
        """Throw away the bytes written so far (they belong to another object version)."""
        log.info("shard %s: restarting download from byte 0 (%s)", self.shard, reason)
        self.file.seek(0)
        self.file.truncate()
        self.hasher.reset()
        self.offset = 0
        self.etag = None
        self._counters.add("restarts")


class Fetcher(Protocol):
    """A storage backend that makes one request per call."""

    def attempt(self, job: Job) -> None:
        """Continue ``job`` from ``job.offset`` until complete, or raise an outcome exception."""


def download(fetcher: Fetcher, job: Job, policy: RetryPolicy, counters: _Counters,
             stop: threading.Event | None = None) -> None:
    """Run ``fetcher`` on ``job`` until the file holds ``job.size`` bytes or retries run out.

    Raises:
        RemoteFetchError: on a permanent refusal, or after ``policy.max_retries`` retries.
        Mismatch: the object's size disagrees with the manifest (the caller quarantines).
    """
    retries = 0
    while True:
        try:
            fetcher.attempt(job)
        except Fatal as exc:
            raise RemoteFetchError(
                f"shard {job.shard!r} at {job.shown}: {exc.reason}; not retried because the "
                "answer is permanent. Check that the dataset still exists at this location and "
                "that the credentials in storage_options (or the environment) grant read access.",
                shard=job.shard, url=job.shown, status=exc.status, attempts=retries + 1) from None
        except Transient as exc:
            retries += 1
            if retries > policy.max_retries:
                raise RemoteFetchError(
                    f"shard {job.shard!r} at {job.shown}: gave up after {retries} requests "
                    f"(last failure: {exc.reason}). The server or network is failing; retry "
                    "later or raise RetryPolicy.max_retries / RetryPolicy.timeout.",
                    shard=job.shard, url=job.shown, status=exc.status, attempts=retries) from None
            counters.add("retries")
            delay = policy.delay(retries, exc.retry_after)
            counters.add("backoff_ms", round(delay * 1000))
            log.info("shard %s: %s; retry %d/%d in %.2fs from byte %d", job.shard, exc.reason,
                     retries, policy.max_retries, delay, job.offset)
            if stop is not None and stop.wait(delay):
                raise CacheError(f"shard {job.shard!r}: download cancelled (cache closed).") from None
            if stop is None and delay > 0:
                threading.Event().wait(delay)
            continue
        if job.offset != job.size:  # a backend bug, not a server fault: fail loudly
            raise Mismatch(f"download ended at byte {job.offset} of {job.size}")
        job.file.flush()
        os.fsync(job.file.fileno())
        return
