"""Threads that fetch the shards the known future needs next, before the reader asks.

Prefetch threads download in parallel but are admitted one at a time, in the order the
shards are needed: a thread claims the next shard, takes its room and reserves its in-flight
bytes before the next thread may claim. So a later shard never takes the room an earlier one
is about to fill (it would be evicted, or refused at commit, when that one lands, then fetched
a second time), and each shard is fetched once per pass. A prefetch that fails is logged
(secrets scrubbed) and left to the foreground request, which retries and reports.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from stoker.cache.lock import FileLock
from stoker.cache.store.redact import Scrubber
from stoker.manifest import StokerError

__all__ = ["Prefetcher"]

log = logging.getLogger("stoker.cache")


class Prefetcher:
    """``workers`` daemon threads that fetch, one admission at a time, what the cache needs next.

    Args:
        workers: number of threads (0: none).
        wake: the cache's condition; its lock is the cache's mutex, which guards the claims.
        closed: set when the cache closes; the threads then stop.
        next_needed: called with the mutex held and a predicate of the shards to pass over;
            returns the next shard to fetch (not on disk, not pinned), or None.
        fetch: ``fetch(i, admitted)`` fetches shard ``i`` under its exclusive lock, calling
            ``admitted`` once its bytes are reserved; True when the shard is now present, False
            when the fetch declined (no room without hurting the schedule).
        lock_path: the lock file of shard ``i``.
        scrub: removes secrets from the messages of failed prefetches.
    """

    def __init__(self, workers: int, *, wake: threading.Condition, closed: threading.Event,
                 next_needed: Callable[[Callable[[int], bool]], int | None],
                 fetch: Callable[[int, Callable[[], None]], bool],
                 lock_path: Callable[[int], str], scrub: Scrubber) -> None:
        self._wake = wake
        self._closed = closed
        self._next_needed = next_needed
        self._fetch = fetch
        self._lock_path = lock_path
        self._scrub = scrub
        self._claimed: set[int] = set()
        # Held by one thread from its claim until its bytes are reserved (module doc).
        self._admission = threading.Lock()
        self._failed: set[int] = set()  # left to the foreground until the plan changes
        self._threads = [threading.Thread(target=self._loop, name=f"stoker-prefetch-{k}",
                                          daemon=True) for k in range(workers)]

    def start(self) -> None:
        """Start the threads."""
        for t in self._threads:
            t.start()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for each thread (after ``closed`` is set)."""
        for t in self._threads:
            t.join(timeout=timeout)

    def forget_failures(self) -> None:
        """The plan changed: prefetch shards that failed before again (the mutex held)."""
        self._failed.clear()

    def _loop(self) -> None:
        while not self._closed.is_set():
            self._admission.acquire()
            admitted = _Once(self._admission.release)
            try:
                i = self._claim_next()
            except BaseException:
                admitted()
                raise
            if i is None:
                admitted()
                with self._wake:
                    self._wake.wait(0.2)
                continue
            declined = True
            try:
                lock = FileLock(self._lock_path(i))
                if lock.acquire(shared=False, timeout=0):
                    try:
                        declined = not self._fetch(i, admitted)
                    finally:
                        lock.release()
            except (StokerError, OSError) as exc:  # the foreground request retries and reports
                if not self._closed.is_set():  # else cancelled by close(): nothing to report
                    log.warning("prefetch of shard %d failed (%s: %s); it will be fetched on "
                                "demand", i, type(exc).__name__, self._scrub(str(exc)))
                    with self._wake:
                        self._failed.add(i)
            finally:
                # Unclaimed before the next thread may claim: a declined shard is then the one
                # it retries, never skipped for a later one that takes the room this one needs
                # (and is evicted for it, then fetched again).
                with self._wake:
                    self._claimed.discard(i)
                admitted()
                if declined and not self._closed.is_set():
                    with self._wake:
                        self._wake.wait(0.2)  # no room ahead of need: let the reader move on

    def _claim_next(self) -> int | None:
        with self._wake:
            i = self._next_needed(self._passed_over)
            if i is not None:
                self._claimed.add(i)
            return i

    def _passed_over(self, i: int) -> bool:
        return i in self._claimed or i in self._failed


class _Once:
    """Call ``fn`` the first time this is called; later calls do nothing (thread-safe)."""

    __slots__ = ("_fn", "_lock")

    def __init__(self, fn: Callable[[], None]) -> None:
        self._fn: Callable[[], None] | None = fn
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            fn, self._fn = self._fn, None
        if fn is not None:
            fn()

