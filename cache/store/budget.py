"""The node-wide byte budget of one dataset's cache directory, shared by every process.

Two pools, both decided under one ``flock`` (``budget.lock``) so processes never race:

* committed files (``shards/`` + ``quarantine/``) and the node cache's record files
  (``<cache dir>/row-major``, derived data: :mod:`stoker.cache.store.derived`) stay within
  ``limit``: before a shard is renamed in, room is made by deleting the least recently used
  record files first (they can be rebuilt from shards), then shards in the caller's policy's
  eviction order; a record file is saved only into room its save finds under the same lock;
* files being written (``tmp/``) stay within the in-flight allowance: a temp file's name
  carries the bytes it reserves, so every process sees every other's reservations, and a
  crashed process's reservations vanish when start-up repair removes its temp files.

Hence disk use never exceeds ``limit + allowance``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Callable, Iterator

from stoker.cache.errors import CacheError, CacheLimitError
from stoker.cache.lock import FileLock
from stoker.cache.stats import _Counters
from stoker.cache.store.derived import DerivedFiles
from stoker.cache.store.layout import Layout

__all__ = ["Budget", "CommittedFile"]

log = logging.getLogger("stoker.cache")

# How long a foreground request waits for other processes before giving up.
ROOM_WAIT_S = 60.0
# After this long a waiting request says so (once), naming what it waits for and the fix.
WAIT_NOTICE_S = 1.0

# (shard index or None for a quarantined copy, size in bytes, path)
CommittedFile = tuple["int | None", int, str]


class Budget:
    """Admission, reservation and eviction for one cache directory.

    Args:
        layout: the directory.
        limit: bytes allowed for committed files, or ``None`` (unbounded).
        allowance: bytes allowed in flight.
        allowance_grows: True when ``allowance`` was a default guess that may grow to fit a
            measured materialisation; False when the user declared it (a hard bound).
        counters: where evictions are counted.
        closed: set when the owning cache closes; every wait gives up then.
        victims: ``(shard, files, prefetch) -> files`` in eviction order (the policy).
        own_pins: ``(shard) -> (count, bytes)`` pinned by this process, other than ``shard``.
        derived: the node cache's record files, counted (and deleted first) under ``limit``.
    """

    def __init__(self, layout: Layout, limit: int | None, allowance: int, allowance_grows: bool,
                 counters: _Counters, closed: threading.Event,
                 victims: Callable[[int, list[CommittedFile], bool], list[CommittedFile]],
                 own_pins: Callable[[int], tuple[int, int]],
                 derived: DerivedFiles | None = None) -> None:
        self._layout = layout
        self._derived = derived
        self.limit = limit
        self.allowance = allowance
        self._grows = allowance_grows
        self._counters = counters
        self._closed = closed
        self._victims = victims
        self._own_pins = own_pins

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the node-wide budget lock."""
        lock = FileLock(self._layout.budget_lock)
        while not lock.acquire(timeout=0.25):
            if self._closed.is_set():
                raise CacheError("this ShardCache was closed while waiting for the budget lock.")
        try:
            yield
        finally:
            lock.release()

    # -- in flight ------------------------------------------------------------------------------
    def reserve(self, i: int, nbytes: int, kind: str, *, wait: bool, held: int,
                what: str) -> str | None:
        """Create shard ``i``'s temp file reserving ``nbytes`` once the allowance has room.

        ``held`` is what this very job already has in flight; if that plus ``nbytes`` exceeds
        the allowance, waiting could never help. Without ``wait``, None means "no room now".
        """
        if held + nbytes > self.allowance and self._grows:
            # The default only guessed the uncompressed size; the rewrite is now measured.
            log.info("inflight_allowance grows from %d to %d bytes for shard %d",
                     self.allowance, held + nbytes, i)
            self.allowance = held + nbytes
        if held + nbytes > self.allowance:
            raise CacheLimitError(
                f"shard {i} ({what}) needs {held + nbytes} bytes in flight at once (download "
                f"plus uncompressed rewrite), more than inflight_allowance {self.allowance} "
                f"bytes. Raise inflight_allowance to at least {held + nbytes}.")
        deadline = time.monotonic() + ROOM_WAIT_S
        notice = _Notice(lambda: (
            f"shard {i} ({what}) is waiting for {nbytes} bytes of inflight_allowance "
            f"({self.allowance} bytes, {self.inflight()} held by downloads in progress); it "
            f"gives up after {ROOM_WAIT_S:.0f}s. Raise inflight_allowance or run fewer "
            "concurrent loaders on this node."))
        while True:
            with self.locked():
                if self.inflight() + nbytes <= self.allowance:
                    path = self._layout.temp(i, nbytes, kind)
                    open(path, "wb").close()
                    return path
            if not wait:
                return None
            if time.monotonic() > deadline:
                raise CacheLimitError(
                    f"shard {i}: waited {ROOM_WAIT_S:.0f}s for {nbytes} bytes of "
                    f"inflight_allowance ({self.allowance} bytes) held by other downloads. "
                    "Raise inflight_allowance or run fewer concurrent loaders on this node.")
            notice.check()
            if self._closed.wait(0.02):
                raise CacheError("this ShardCache was closed while waiting to download.")

    def inflight(self, exclude: int | None = None) -> int:
        """Bytes reserved by temp files of every process (except those of shard ``exclude``)."""
        total = 0
        for entry in os.scandir(self._layout.tmp):
            info = Layout.temp_info(entry.name)
            if info is not None and info[0] != exclude:
                total += info[1]
        return total

    # -- committed ------------------------------------------------------------------------------
    def committed(self) -> list[CommittedFile]:
        """Every committed file: quarantined copies and shards."""
        return Layout.committed_in(self._layout.root)

    def with_room(self, i: int, need: int, prefetch: bool,
                  action: Callable[[], None] | None = None) -> bool:
        """Evict until ``need`` more bytes fit in ``limit``, then run ``action`` (lock held).

        A prefetch only evicts what the policy allows for it and never waits (False = declined);
        a foreground request evicts any unpinned shard and waits for other processes to unpin.
        """
        if self.limit is None:  # nothing to decide, nothing to serialise
            if action is not None:
                action()
            return True
        deadline = time.monotonic() + ROOM_WAIT_S
        notice = _Notice(lambda: (
            f"shard {i} is waiting for {need} bytes of room under cache limit {self.limit} "
            f"bytes: every cached shard is pinned ({self._used()} bytes used; this process "
            f"pins {self._own_pins(i)[1]}, other processes on this node the rest). It gives "
            f"up after {ROOM_WAIT_S:.0f}s; raise the cache limit (shared by every process using "
            "this cache_dir) or read with fewer workers/ranks per node."))
        while True:
            with self.locked():
                if self._make_room(i, need, prefetch):
                    if action is not None:
                        action()
                    return True
            if prefetch:
                return False
            self._check_progress(i, need, deadline)
            notice.check()
            if self._closed.wait(0.05):
                raise CacheError("this ShardCache was closed while waiting for room.")

    def _used(self) -> int:
        derived = 0 if self._derived is None else self._derived.used()
        return derived + sum(size for _, size, _ in self.committed())

    def _make_room(self, i: int, need: int, prefetch: bool) -> bool:
        if self.limit is None:
            return True
        files = self.committed()
        used = sum(size for _, size, _ in files)
        if prefetch:
            # Other shards in flight will be committed soon and most are needed sooner (they
            # were claimed earlier): count them, so a prefetch never takes their room.
            used += self.inflight(exclude=i)
        if self._derived is not None:  # record files count, and go first: they are rebuilt
            records, writing = self._derived.scan()
            used += sum(size for _, size, _ in records + writing)
            used, deleted = self._derived.evict(used, need, self.limit, records + writing)
            self._counters.add("derived_evictions", deleted)
        if used + need <= self.limit:
            return True
        for idx, size, path in self._victims(i, files, prefetch):
            if self.evict(idx, path):
                used -= size
                if used + need <= self.limit:
                    return True
        return False

    def evict(self, idx: int | None, path: str) -> bool:
        """Delete one committed file unless someone pins or writes it; True if it is gone."""
        if idx is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return True
        lock = FileLock(self._layout.lock(idx))
        if not lock.acquire(timeout=0):
            return False  # pinned or being written by someone, somewhere on this node
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._layout.sidecar(idx))
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        finally:
            lock.release()
        self._counters.add("evictions")
        return True

    def _check_progress(self, i: int, need: int, deadline: float) -> None:
        limit = self.limit or 0
        count, pinned = self._own_pins(i)
        if pinned + need > limit:
            raise CacheLimitError(
                f"cache limit {limit} bytes is too small: this process pins {count} shards "
                f"({pinned} bytes) and shard {i} needs {need} more. Raise the cache limit "
                f"(CacheOptions(limit=...), --cache-limit) to at least {pinned + need} bytes, "
                "or pin fewer shards at once.")
        if time.monotonic() > deadline:
            raise CacheLimitError(
                f"shard {i}: waited {ROOM_WAIT_S:.0f}s for {need} bytes under cache limit "
                f"{limit} bytes while other processes on this node pin the rest. Raise "
                "the cache limit (it is shared by every process using this cache directory).")


class _Notice:
    """Logs ``message()`` once, when a wait has lasted :data:`WAIT_NOTICE_S`: a loader that
    must wait for cache room says so long before it gives up."""

    __slots__ = ("_due", "_message")

    def __init__(self, message: Callable[[], str]) -> None:
        self._due: float | None = time.monotonic() + WAIT_NOTICE_S
        self._message = message

    def check(self) -> None:
        if self._due is not None and time.monotonic() >= self._due:
            self._due = None
            log.warning(self._message())
