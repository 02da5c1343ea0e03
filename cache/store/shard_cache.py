"""ShardCache: a node-local store of verified, materialised shards under a byte budget.

Any number of processes on a node may open the same ``cache_dir``; they coordinate only
through the file system:

* Per-shard ``flock`` locks (``locks/NNNNNNNN.lock``): a pin holds it *shared*, a download or
  an eviction holds it *exclusive*. So a shard is downloaded once per node however many ranks
  and workers ask, a pinned shard is never evicted, and a killed holder's lock vanishes with
  it (the kernel releases ``flock`` locks on close, including death).
* A budget lock serialises every decision about bytes: admitting a shard, evicting one,
  reserving in-flight bytes. Committed files (``shards/`` + ``quarantine/``) stay within
  ``limit``; files being written (``tmp/``) stay within ``inflight_allowance``; so disk use
  never exceeds ``limit + inflight_allowance``.
* Derived data lives under the same limit: the record files of ``<cache_dir>/row-major``
  count against it, and go first when a shard needs room (:mod:`stoker.cache.store.derived`);
  :meth:`ShardCache.derived_budget` hands the loader's record store the budget to save into.
* Eviction follows Belady (:mod:`stoker.cache.store.eviction`): the unpinned shard whose next
  use (in the future sequence given by :meth:`ShardCache.set_future`) is furthest away goes
  first.
* Verified twice over: a download is hashed (xxh3-128) against the manifest before it is
  committed, and a committed file is re-hashed every time it is handed out again (a pin that
  finds it on disk; nested pins of a shard this process already pins share the first one's
  check). Sidecars vouch by size and mtime only, which bit rot keeps; the re-hash costs about
  one read of the file from page cache. Only the first pin after this process itself verified
  the file in full (downloaded it, or re-hashed it for another pin) skips it. A file that
  fails is quarantined and fetched again, exactly like a corrupt download.
* Prefetch threads download in parallel but are admitted one at a time, in the order the
  shards are needed (:mod:`stoker.cache.store.prefetch`); downloads go through
  :mod:`stoker.cache.store.install`.

The cache knows manifests and bytes, never samples.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from stoker.cache.errors import CacheError
from stoker.cache.fetch.backends import fetcher_for
from stoker.cache.fetch.retry import RetryPolicy
from stoker.cache.lock import FileLock
from stoker.cache.stats import CacheStats, _Counters
from stoker.cache.store.budget import Budget, CommittedFile
from stoker.cache.store.derived import DerivedBudget, DerivedFiles
from stoker.cache.store.eviction import POLICIES, rank_victims
from stoker.cache.store.future import FutureIndex
from stoker.cache.store.install import Installer
from stoker.cache.store.layout import Layout
from stoker.cache.store.limits import check_limits
from stoker.cache.store.prefetch import Prefetcher
from stoker.cache.store.redact import Scrubber
from stoker.cache.store.repair import repair
from stoker.cache.store.trust import FileTrust
from stoker.manifest import Manifest, locations, parse_size

__all__ = ["ShardCache"]


class ShardCache:
    """Local, verified, materialised copies of a dataset's shards.

    Args:
        manifest: the dataset (loaded with :meth:`Manifest.load`, so it knows its root).
        cache_dir: directory shared by every process of the node; each dataset gets its own
            sub-directory named by its fingerprint.
        limit: byte budget for this dataset's cached files: an int, a string such as
            ``"50GB"``/``"512MiB"``, or ``None`` (unbounded). Must hold the largest shard.
        storage_options: passed to fsspec (``s3://``, ``gs://``, ...) or to the HTTP client
            (``headers``); never logged.
        inflight_allowance: bytes that downloads and materialisations in progress may occupy
            on top of ``limit``. Default: twice the largest shard (ten times for zstd datasets,
            which hold a compressed download and its uncompressed rewrite at once); for zstd
            the default grows to fit the largest rewrite actually measured. An explicit value
            is a hard bound: a shard that cannot fit it is a :class:`CacheLimitError`.
        retry: the download retry policy (default :class:`RetryPolicy`).
        prefetch_workers: threads that download shards ahead of need (0 = none).
        prefetch_ahead: how many distinct upcoming shards the prefetchers look at.
        eviction: ``"belady"`` (default; uses :meth:`set_future`) or ``"lru"`` (for
            comparison; prefetching then uses free space only).
        max_pinned: how many shards the caller pins at once at most (a reader keeping several
            shards open). ``limit`` must hold that many of the largest shards plus one being
            admitted, checked here so that a too-small limit fails at start, not mid-epoch.

    Raises:
        CacheLimitError: ``limit`` or ``inflight_allowance`` cannot hold the largest shard.
        ValueError: an option is malformed.
    """

    def __init__(self, manifest: Manifest, cache_dir: str | os.PathLike[str], *,
                 limit: int | str | None = None, storage_options: Mapping[str, Any] | None = None,
                 inflight_allowance: int | str | None = None, retry: RetryPolicy | None = None,
                 prefetch_workers: int = 2, prefetch_ahead: int = 8,
                 eviction: str = "belady", max_pinned: int = 1) -> None:
        if not isinstance(manifest, Manifest):
            raise TypeError(f"manifest must be a stoker Manifest, got {type(manifest).__name__}.")
        if manifest.root is None:
            raise ValueError("manifest has no dataset root (built in memory); load it with "
                             "Manifest.load(location) so shard locations can be resolved.")
        if not isinstance(prefetch_workers, int) or prefetch_workers < 0:
            raise ValueError(f"prefetch_workers must be an int >= 0, got {prefetch_workers!r}.")
        if not isinstance(prefetch_ahead, int) or prefetch_ahead < 1:
            raise ValueError(f"prefetch_ahead must be an int >= 1, got {prefetch_ahead!r}.")
        if not isinstance(max_pinned, int) or max_pinned < 1:
            raise ValueError(f"max_pinned must be an int >= 1, got {max_pinned!r}.")
        if eviction not in POLICIES:
            raise ValueError(f"eviction must be one of {POLICIES}, got {eviction!r}.")
        self._manifest = manifest
        self._pid = os.getpid()
        self._options = {"limit": limit, "storage_options": storage_options,
                         "inflight_allowance": inflight_allowance, "retry": retry,
                         "prefetch_workers": prefetch_workers, "prefetch_ahead": prefetch_ahead,
                         "eviction": eviction, "max_pinned": max_pinned}
        self._cache_dir = os.fspath(cache_dir)
        self._zstd = manifest.compression == "zstd"
        self._limit = None if limit is None else parse_size(limit, "limit")
        allowance = check_limits(manifest, self._limit, inflight_allowance, max_pinned)
        self._policy = retry if retry is not None else RetryPolicy()
        self._eviction = eviction
        self._prefetch_ahead = prefetch_ahead
        self._layout = Layout(cache_dir, manifest.fingerprint)
        self._counters = _Counters()
        self._mutex = threading.Lock()
        self._wake = threading.Condition(self._mutex)
        self._closed = threading.Event()
        self._pins: dict[int, int] = {}
        self._pin_locks: dict[int, FileLock] = {}
        self._shard_mutexes: dict[int, threading.Lock] = {}
        self._future: FutureIndex | None = None
        self._clock = itertools.count(1)
        self._last_used: dict[int, int] = {}
        self._records = locations.cache_records_dir(self._cache_dir)
        self._budget = Budget(self._layout, self._limit, allowance, inflight_allowance is None,
                              self._counters, self._closed, self._victims, self._own_pins,
                              DerivedFiles(self._records))
        self._trust = FileTrust(self._layout, manifest, self._budget, self._counters)
        fetcher = fetcher_for(manifest.root, storage_options, self._policy)
        self._installer = Installer(manifest, self._layout, self._budget, fetcher, self._policy,
                                    self._counters, self._closed, self._limit, self._trust)
        repair(self._layout, manifest, self._counters)
        self._prefetcher = Prefetcher(
            prefetch_workers, wake=self._wake, closed=self._closed,
            next_needed=self._next_to_prefetch, fetch=self._prefetch, lock_path=self._layout.lock,
            scrub=Scrubber(storage_options))
        self._prefetcher.start()

    # -- public API -------------------------------------------------------------------------
    @property
    def limit(self) -> int | None:
        """The byte budget for committed files, or ``None`` (unbounded)."""
        return self._limit

    @property
    def inflight_allowance(self) -> int:
        """Bytes that files being written may add on top of :attr:`limit`."""
        return self._budget.allowance

    @property
    def directory(self) -> str:
        """This dataset's directory inside ``cache_dir``."""
        return self._layout.root

    def derived_budget(self, directory: str | os.PathLike[str]) -> DerivedBudget | None:
        """The budget record files saved in ``directory`` must keep to: this cache's limit,
        when ``directory`` is the node cache's records directory (``<cache_dir>/row-major``)
        and there is a limit; else ``None`` (the record store's own bound applies)."""
        if self._limit is None or not _same_dir(directory, self._records):
            return None
        return DerivedBudget(self._layout.root, self._records, self._limit)

    def path(self, index: int) -> str:
        """Local path of shard ``index``, downloading (and verifying) it first if needed.

        The file may be evicted as soon as this returns; read it under :meth:`pin`.
        """
        with self.pin(index) as local:
            return local

    @contextlib.contextmanager
    def pin(self, index: int) -> Iterator[str]:
        """``with cache.pin(i) as path:``: shard ``i`` is present and cannot be evicted inside.

        Pins are counted, so nested and concurrent pins of one shard are fine. Pinning a shard
        also moves the future cursor past its next scheduled read.
        """
        i = self._check_index(index)
        self._acquire(i)
        try:
            yield self._layout.data(i)
        finally:
            self._release(i)

    def set_future(self, upcoming: Sequence[int], spans: np.ndarray | None = None) -> None:
        """Tell the cache which shards will be read, in order, from now on: every *use*, a
        shard needed again later appearing again (stoker.cache.store.future).

        Drives prefetching (the next ``prefetch_ahead`` distinct shards are fetched in the
        background) and Belady eviction (the shard whose next use is furthest goes first).
        ``spans``: ``[first, last]`` order positions of each use (the loader's
        ``EpochOrder.shard_uses``); the caller then reports its progress with
        :meth:`advance_to`. Without spans each entry is one read and reads move the cursor.
        Call it again whenever the plan changes (a new epoch, a resume); it costs
        O(n log n) in the sequence length.
        """
        future = FutureIndex(upcoming, self._manifest.num_shards, spans)
        with self._wake:
            self._future = future
            self._prefetcher.forget_failures()
            self._installer.forget_failures()
            self._wake.notify_all()

    def advance_to(self, position: int) -> None:
        """The reader has got to order ``position`` (a future set with ``spans``)."""
        with self._wake:
            if self._future is not None:
                self._future.advance_to(position)
                self._wake.notify_all()

    def stats(self) -> CacheStats:
        """Counters of this process's cache object (no URLs, no secrets)."""
        return self._counters.snapshot()

    def close(self) -> None:
        """Stop the prefetch threads and drop this process's pins; idempotent."""
        if self._closed.is_set():
            return
        with self._wake:
            self._closed.set()
            self._wake.notify_all()
        # A thread inside a stalled read notices only at the socket timeout; it removes its
        # own temp files then, so close() does not wait for it beyond a few seconds.
        self._prefetcher.join(timeout=5.0)
        with self._mutex:
            for lock in self._pin_locks.values():
                lock.release()
            self._pin_locks.clear()
            self._pins.clear()

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickling (e.g. into spawned worker processes) re-opens the same cache directory:
        threads and locks are per process, the files on disk are shared."""
        return (_reopen, (self._manifest, self._cache_dir, self._options))

    def __enter__(self) -> "ShardCache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"ShardCache(dir={self._layout.root!r}, limit={self._limit}, "
                f"shards={self._manifest.num_shards}, eviction={self._eviction!r})")

    # -- validation -------------------------------------------------------------------------
    def _check_index(self, index: int) -> int:
        n = self._manifest.num_shards
        if isinstance(index, bool) or not isinstance(index, int) and not hasattr(index, "__index__"):
            raise TypeError(f"shard index must be an int, got {type(index).__name__}.")
        i = int(index)
        if not 0 <= i < n:
            raise IndexError(f"shard index {i} is out of range for a dataset of {n} shards.")
        return i

    # -- pinning ------------------------------------------------------------------------------
    def _shard_mutex(self, i: int) -> threading.Lock:
        with self._mutex:
            return self._shard_mutexes.setdefault(i, threading.Lock())

    def _acquire(self, i: int) -> None:
        with self._shard_mutex(i):
            with self._mutex:
                if self._closed.is_set():
                    raise CacheError("this ShardCache is closed; open a new one.")
                if os.getpid() != self._pid:
                    raise CacheError(
                        "this ShardCache was created in another process and inherited through "
                        "fork; its locks and prefetch threads do not carry over. Create one "
                        "ShardCache per process on the same cache_dir (or pickle it: unpickling "
                        "re-opens the cache in the new process).")
                if self._pins.get(i):
                    self._pins[i] += 1
                    self._note_use(i)
                    self._counters.add("hits")
                    return
            lock = FileLock(self._layout.lock(i))
            try:
                hit = self._lock_present(i, lock)
            except BaseException:
                lock.release()
                raise
            with self._wake:
                self._pins[i] = 1
                self._pin_locks[i] = lock
                self._note_use(i)
                self._wake.notify_all()
            self._counters.add("hits" if hit else "misses")

    def _note_use(self, i: int) -> None:
        """Record a read of ``i`` (mutex held): LRU clock and the future cursor."""
        self._last_used[i] = next(self._clock)
        if self._future is not None:
            self._future.advance(i, window=4 * self._prefetch_ahead + 64)

    def _lock_present(self, i: int, lock: FileLock) -> bool:
        """Hold ``lock`` shared with shard ``i`` complete and intact on disk; True if it was.

        A file already on disk is re-hashed before it is handed out (:meth:`FileTrust.intact`); one
        that fails takes the corrupt-shard path: quarantined under the exclusive lock, then
        fetched again (a second verification failure is a ``ShardIntegrityError``).
        """
        hit = lock.acquire(shared=True, timeout=0)
        if not hit:
            self._wait(lock, shared=True)
        while not (self._trust.is_present(i) and self._trust.intact(i)):
            hit = False
            lock.release()
            self._wait(lock, shared=False)
            # Re-judged under the exclusive lock: another process may have repaired it.
            if not (self._trust.is_present(i) and self._trust.intact(i, repair=True)):
                self._installer.install(i, prefetch=False)
            self._wait(lock, shared=True)  # exclusive -> shared; not atomic, so re-check
        return hit

    def _wait(self, lock: FileLock, *, shared: bool) -> None:
        while not lock.acquire(shared=shared, timeout=0.25):
            if self._closed.is_set():
                raise CacheError("this ShardCache was closed while waiting for a shard lock.")

    def _release(self, i: int) -> None:
        with self._wake:
            self._pins[i] -= 1
            if self._pins[i] == 0:
                del self._pins[i]
                lock = self._pin_locks.pop(i, None)
                if lock is not None:
                    lock.release()
            self._wake.notify_all()

    # -- eviction and prefetching -------------------------------------------------------------
    def _victims(self, i: int, files: list[CommittedFile], prefetch: bool) -> list[CommittedFile]:
        """Eviction candidates for admitting ``i``, best first (:func:`rank_victims`)."""
        with self._mutex:
            return rank_victims(i, files, prefetch, policy=self._eviction, pinned=self._pins,
                                last_used=self._last_used, future=self._future)

    def _own_pins(self, i: int) -> tuple[int, int]:
        """(count, bytes) of the shards this process pins, other than ``i``."""
        with self._mutex:
            mine = [p for p in self._pins if p != i]
        sizes = []
        for p in mine:
            with contextlib.suppress(FileNotFoundError):
                sizes.append(os.path.getsize(self._layout.data(p)))
        return len(mine), sum(sizes)

    def _next_to_prefetch(self, passed_over: Callable[[int], bool]) -> int | None:
        """The first of the next ``prefetch_ahead`` shards of the future that is neither on
        disk, pinned nor ``passed_over`` (the mutex held)."""
        if self._future is None or self._closed.is_set():
            return None
        for s in self._future.upcoming(self._prefetch_ahead):
            if passed_over(s) or s in self._pins:
                continue
            if not self._trust.is_present(s):
                return s
        return None

    def _prefetch(self, i: int, admitted: Callable[[], None]) -> bool:
        """Fetch shard ``i`` ahead of need (its lock held exclusive); False if it declined."""
        return self._trust.is_present(i) or self._installer.install(i, prefetch=True,
                                                              admitted=admitted)


def _same_dir(a: str | os.PathLike[str], b: str) -> bool:
    return os.path.realpath(os.path.abspath(a)) == os.path.realpath(os.path.abspath(b))


def _reopen(manifest: Manifest, cache_dir: str, options: dict[str, Any]) -> ShardCache:
    return ShardCache(manifest, cache_dir, **options)

