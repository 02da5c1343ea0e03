"""Putting one shard into the store: download, verify, materialise, commit.

The download goes into a temp file whose bytes the budget has reserved; it is hashed
(xxh3-128) against the manifest before it is committed, and a copy that fails is quarantined
and fetched once more (a second failure is a ``ShardIntegrityError``). A zstd shard is then
rewritten uncompressed (:mod:`stoker.cache.store.materialise`), and the file is renamed into
``shards/`` with its sidecar once the budget has made room for it. A download that failed for
good is remembered until the plan changes, so asking again re-raises instead of downloading
again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Callable

from stoker.cache.errors import CacheError, CacheLimitError, RemoteFetchError
from stoker.cache.fetch.download import Fetcher, Job, Mismatch, download
from stoker.cache.fetch.retry import RetryPolicy
from stoker.cache.stats import _Counters
from stoker.cache.store.budget import Budget
from stoker.cache.store.layout import Layout
from stoker.cache.store.materialise import materialise
from stoker.cache.store.sidecar import Sidecar
from stoker.cache.store.trust import FileTrust
from stoker.manifest import Manifest, ShardIntegrityError, hash_file, redact_url

__all__ = ["Installer"]

log = logging.getLogger("stoker.cache")


class Installer:
    """Downloads, verifies, materialises and commits shards of one dataset's cache directory.

    Args:
        manifest: the dataset.
        layout: where its files live.
        budget: the node-wide byte budget that admits every temp and committed file.
        fetcher: the backend that serves the dataset's root.
        policy: the download retry policy.
        counters: the cache's counters.
        closed: set when the cache closes (cancels downloads in progress).
        limit: the cache's byte limit, or ``None``.
        trust: told of every file verified in full as it came in (the next pin skips the
            re-hash once).
    """

    def __init__(self, manifest: Manifest, layout: Layout, budget: Budget, fetcher: Fetcher,
                 policy: RetryPolicy, counters: _Counters, closed: threading.Event,
                 limit: int | None, trust: FileTrust) -> None:
        self._manifest = manifest
        self._layout = layout
        self._budget = budget
        self._fetcher = fetcher
        self._policy = policy
        self._counters = counters
        self._closed = closed
        self._limit = limit
        self._trust = trust
        self._zstd = manifest.compression == "zstd"
        # Shards whose download failed for good (verification failed twice, a permanent
        # refusal, retries exhausted in the foreground): asking again before the plan changes
        # (the reader, then its fallback path) re-raises instead of downloading again.
        self._failed: dict[int, Callable[[], Exception]] = {}

    def forget_failures(self) -> None:
        """The plan changed: shards that failed for good may be tried again."""
        self._failed.clear()

    def install(self, i: int, *, prefetch: bool,
                admitted: Callable[[], None] = lambda: None) -> bool:
        """Download, verify, materialise and commit shard ``i`` (its lock held exclusive).

        ``admitted`` is called once the download's room and in-flight bytes are reserved; a
        prefetcher then lets the next one claim (when it declines, its loop does so after
        unclaiming the shard). Returns False only when a prefetch declines (no room without
        hurting the schedule).
        """
        failed = self._failed.get(i)
        if failed is not None:
            raise failed()
        try:
            return self._fetch_checked(i, prefetch=prefetch, admitted=admitted)
        except RemoteFetchError as exc:
            if not prefetch:  # a failed prefetch is left to the foreground to try again
                self._failed[i] = lambda e=exc: RemoteFetchError(  # type: ignore[misc]
                    str(e), shard=e.shard, url=e.url, status=e.status, attempts=e.attempts)
            raise
        except ShardIntegrityError as exc:
            self._failed[i] = lambda e=exc: ShardIntegrityError(str(e), shard=e.shard)  # type: ignore[misc]
            raise

    def _fetch_checked(self, i: int, *, prefetch: bool, admitted: Callable[[], None]) -> bool:
        shard = self._manifest.shards[i]
        if not self._budget.with_room(i, shard.bytes, prefetch):
            return False
        url = self._manifest.shard_location(i)
        shown = redact_url(url)
        temps: list[str] = []
        try:
            for attempt in (1, 2):
                part = self._budget.reserve(i, shard.bytes, "part", wait=not prefetch, held=0,
                                            what=repr(shard.path))
                if part is None:  # declined: the prefetch loop unclaims it, then admits
                    return False
                admitted()  # the temp file now counts against every later prefetch
                temps.append(part)
                problem = self._download(i, url, shown, part)
                if problem is None:
                    break
                self._quarantine(i, part, problem)
                if attempt == 2:
                    raise ShardIntegrityError(
                        f"shard {i} ({shard.path!r}) from {shown} failed verification twice "
                        f"({problem}); the stored copy is corrupt or differs from the manifest. "
                        f"Restore the shard or re-create the dataset with `stoker shard`; the "
                        f"rejected copies are in {self._layout.quarantine}.", shard=shard.path)
            final, local_hash = part, shard.xxh3_128
            if self._zstd:
                final = materialise(part, lambda n: self._reserve_rewrite(i, n))
                temps.append(final)
                os.unlink(part)
                local_hash = hash_file(final)[0]
            if not self._commit(i, final, local_hash, prefetch):
                return False
            self._counters.add("fetches")
            if prefetch:
                self._counters.add("prefetches")
            return True
        finally:
            for tmp in temps:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)

    def _download(self, i: int, url: str, shown: str, part: str) -> str | None:
        """Fill ``part`` with shard ``i``; None if it verifies, else what was wrong."""
        shard = self._manifest.shards[i]
        try:
            with open(part, "wb") as f:
                job = Job(url, shown, shard.path, shard.bytes, f, self._counters, self._closed)
                download(self._fetcher, job, self._policy, self._counters, self._closed)
        except Mismatch as exc:
            return str(exc)
        digest, size = job.hasher.hexdigest(), job.offset
        if size != shard.bytes or os.path.getsize(part) != size:
            return f"got {size} bytes, the manifest says {shard.bytes}"
        if digest != shard.xxh3_128:
            return f"xxh3-128 is {digest}, the manifest says {shard.xxh3_128}"
        return None

    def _quarantine(self, i: int, path: str, problem: str) -> None:
        self._counters.add("quarantines")
        log.warning("shard %d (%s): %s; quarantined, fetching again",
                    i, self._manifest.shards[i].path, problem)
        size = os.path.getsize(path)

        def keep() -> None:
            os.replace(path, self._layout.quarantined(i))

        # Kept for inspection only if that fits the budget without evicting needed shards.
        if size == 0 or not self._budget.with_room(i, size, True, keep):
            os.unlink(path)

    def _commit(self, i: int, tmp: str, local_hash: str, prefetch: bool) -> bool:
        size = os.path.getsize(tmp)
        if self._limit is not None and size > self._limit:
            raise CacheLimitError(
                f"shard {i} ({self._manifest.shards[i].path!r}) takes {size} bytes once "
                f"materialised (uncompressed), more than the cache limit {self._limit} bytes. "
                f"Raise the cache limit (CacheOptions(limit=...), --cache-limit) to at least "
                f"{size} bytes.")

        def install() -> None:
            target = self._layout.data(i)
            os.replace(tmp, target)
            st = os.stat(target)
            Sidecar(self._manifest.shards[i].xxh3_128, self._manifest.shards[i].bytes,
                    local_hash, st.st_size, st.st_mtime_ns, self._zstd).write(
                        self._layout.sidecar(i))
            self._trust.verified(i, st)  # hashed as it came in

        return self._budget.with_room(i, size, prefetch, install)

    def _reserve_rewrite(self, i: int, nbytes: int) -> str:
        shard = self._manifest.shards[i]
        path = self._budget.reserve(i, nbytes, "mat", wait=True, held=shard.bytes,
                                    what=repr(shard.path))
        if path is None:  # unreachable with wait=True; keeps the type exact
            raise CacheError(f"shard {i}: no in-flight room to materialise.")
        return path
