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
* Eviction follows Belady: the unpinned shard whose next use (in the future sequence given by
  :meth:`ShardCache.set_future`) is furthest away goes first; shards never needed again go
  before any others. Prefetching ahead of need only ever evicts shards needed *later* than
  the one it fetches, so it never makes the optimal schedule worse.
* Verified twice over: a download is hashed (xxh3-128) against the manifest before it is
  committed, and a committed file is re-hashed every time it is handed out again (a pin that
  finds it on disk; nested pins of a shard this process already pins share the first one's
  check). Sidecars vouch by size and mtime only, which bit rot keeps; the re-hash costs about
  one read of the file from page cache. Only the first pin after this process itself verified
  the file in full (downloaded it, or re-hashed it for another pin) skips it. A file that
  fails is quarantined and fetched again, exactly like a corrupt download.
* Prefetch threads download in parallel but are admitted one at a time, in the order the
  shards are needed: a thread claims the next shard, takes its room and reserves its
  in-flight bytes before the next thread may claim. So a later shard never takes the room an
  earlier one is about to fill (it would be evicted, or refused at commit, when that one
  lands, then fetched a second time), and each shard is fetched once per pass.

The cache knows manifests and bytes, never samples.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import threading
from typing import Any, Callable, Iterator, Mapping, Sequence
from urllib.parse import urlsplit

import numpy as np

from stoker.cache.budget import Budget, CommittedFile
from stoker.cache.errors import CacheError, CacheLimitError, RemoteFetchError
from stoker.cache.fetch import Fetcher, Job, Mismatch, download
from stoker.cache.fetch_fsspec import FsspecFetcher, LocalFetcher
from stoker.cache.fetch_http import HttpFetcher
from stoker.cache.future import FutureIndex
from stoker.cache.layout import Layout
from stoker.cache.lock import FileLock
from stoker.cache.materialise import materialise
from stoker.cache.redact import Scrubber
from stoker.cache.repair import content_problem, quarantine_committed, repair, vouched
from stoker.cache.retry import RetryPolicy
from stoker.cache.sidecar import Sidecar
from stoker.cache.size import parse_size
from stoker.cache.stats import CacheStats, _Counters
from stoker.manifest import (Manifest, ShardIntegrityError, StokerError, hash_file, is_url,
                             redact_url)

__all__ = ["ShardCache"]

log = logging.getLogger("stoker.cache")

# In-flight footprint of a zstd shard relative to its stored size: the compressed download
# plus the uncompressed rewrite, assuming at most 4:1 compression.
_ZSTD_FOOTPRINT = 5
_POLICIES = ("belady", "lru")


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
        if eviction not in _POLICIES:
            raise ValueError(f"eviction must be one of {_POLICIES}, got {eviction!r}.")
        self._manifest = manifest
        self._pid = os.getpid()
        self._options = {"limit": limit, "storage_options": storage_options,
                         "inflight_allowance": inflight_allowance, "retry": retry,
                         "prefetch_workers": prefetch_workers, "prefetch_ahead": prefetch_ahead,
                         "eviction": eviction, "max_pinned": max_pinned}
        self._cache_dir = os.fspath(cache_dir)
        self._zstd = manifest.compression == "zstd"
        self._limit = None if limit is None else parse_size(limit, "limit")
        allowance = self._check_budget(inflight_allowance, max_pinned)
        self._policy = retry if retry is not None else RetryPolicy()
        self._eviction = eviction
        self._prefetch_ahead = prefetch_ahead
        self._layout = Layout(cache_dir, manifest.fingerprint)
        self._scrub = Scrubber(storage_options)
        self._fetcher = _make_fetcher(manifest.root, storage_options, self._policy)
        self._counters = _Counters()
        self._mutex = threading.Lock()
        self._wake = threading.Condition(self._mutex)
        self._closed = threading.Event()
        self._pins: dict[int, int] = {}
        self._pin_locks: dict[int, FileLock] = {}
        self._shard_mutexes: dict[int, threading.Lock] = {}
        self._trusted: dict[int, tuple[int, int, int]] = {}
        # (inode, size, mtime) of files this process verified in full (downloaded, or
        # re-hashed under the exclusive lock) and has not handed out since: the next pin
        # skips the re-hash once (see _intact).
        self._fresh: dict[int, tuple[int, int, int]] = {}
        self._future: FutureIndex | None = None
        self._claimed: set[int] = set()
        # Held by one prefetch thread from its claim until its bytes are reserved (module doc).
        self._admission = threading.Lock()
        self._prefetch_failed: set[int] = set()  # left to the foreground until set_future
        # Shards whose download failed for good (verification failed twice, a permanent
        # refusal, retries exhausted in the foreground): asking again before the plan changes
        # (the reader, then its fallback path) re-raises instead of downloading again.
        self._failed: dict[int, Callable[[], Exception]] = {}
        self._clock = itertools.count(1)
        self._last_used: dict[int, int] = {}
        self._budget = Budget(self._layout, self._limit, allowance, inflight_allowance is None,
                              self._counters, self._closed, self._victims, self._own_pins)
        repair(self._layout, manifest, self._counters)
        self._threads = [threading.Thread(target=self._prefetch_loop, name=f"stoker-prefetch-{k}",
                                          daemon=True) for k in range(prefetch_workers)]
        for t in self._threads:
            t.start()

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
        shard needed again later appearing again (stoker.cache.future).

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
            self._prefetch_failed.clear()
            self._failed.clear()
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
        for t in self._threads:
            # A thread inside a stalled read notices only at the socket timeout; it removes its
            # own temp files then, so close() does not wait for it beyond a few seconds.
            t.join(timeout=5.0)
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
    def _check_budget(self, inflight_allowance: int | str | None, max_pinned: int) -> int:
        sizes = self._manifest.shard_bytes
        largest = int(sizes.max()) if sizes.size else 0
        big = int(sizes.argmax()) if sizes.size else 0
        if self._limit is not None and self._limit < largest:
            raise CacheLimitError(
                f"cache limit {_human(self._limit)} ({self._limit} bytes) cannot hold shard {big} "
                f"({self._manifest.shards[big].path!r}, {largest} bytes), so no progress is "
                f"possible. Raise cache_limit to at least {largest} bytes; several times that "
                "leaves room for prefetching and for the shards the loader pins at once.")
        if self._limit is not None and max_pinned > 1:
            k = min(max_pinned + 1, int(sizes.size))
            need = int(np.sort(sizes)[-k:].sum())
            if self._limit < need:
                raise CacheLimitError(
                    f"cache limit {_human(self._limit)} ({self._limit} bytes) cannot hold the "
                    f"{max_pinned} shards the reader keeps open at once plus the one it admits "
                    f"next ({need} bytes for the largest {k}). Raise cache_limit to at least "
                    f"{need} bytes, or keep fewer shards open.")
        if inflight_allowance is None:
            return 2 * largest * (_ZSTD_FOOTPRINT if self._zstd else 1)
        allowance = parse_size(inflight_allowance, "inflight_allowance")
        if allowance < largest:
            raise CacheLimitError(
                f"inflight_allowance {allowance} bytes cannot hold one download of shard {big} "
                f"({largest} bytes). Raise it to at least {largest} bytes, or leave it unset "
                "for the default (twice the largest shard).")
        return allowance

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

        A file already on disk is re-hashed before it is handed out (:meth:`_intact`); one
        that fails takes the corrupt-shard path: quarantined under the exclusive lock, then
        fetched again (a second verification failure is a ``ShardIntegrityError``).
        """
        hit = lock.acquire(shared=True, timeout=0)
        if not hit:
            self._wait(lock, shared=True)
        while not (self._is_present(i) and self._intact(i)):
            hit = False
            lock.release()
            self._wait(lock, shared=False)
            # Re-judged under the exclusive lock: another process may have repaired it.
            if not (self._is_present(i) and self._intact(i, repair=True)):
                self._fetch_locked(i, prefetch=False)
            self._wait(lock, shared=True)  # exclusive -> shared; not atomic, so re-check
        return hit

    def _intact(self, i: int, *, repair: bool = False) -> bool:
        """True if shard ``i``'s committed file still has the bytes that were verified.

        Re-hashes the file unless this process verified this very file (same inode, size
        and mtime) in full and has not handed it out since. With ``repair`` (the shard's lock
        held exclusive) a file that fails is quarantined, so the caller fetches it again.
        """
        key = _stat_key(self._layout.data(i))
        if key is None:
            return False
        if self._fresh.pop(i, None) == key:
            return True
        problem = content_problem(self._layout, self._manifest, i)
        if problem is None:
            if repair:  # the shared re-check that follows need not hash it again
                self._fresh[i] = key
            return True
        if repair:
            self._trusted.pop(i, None)
            with self._budget.locked():  # a rename between budget pools, seen by no scan half-way
                quarantine_committed(self._layout, i, problem, self._counters)
        return False

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

    def _is_present(self, i: int) -> bool:
        """True if shard ``i``'s committed file is vouched for by its sidecar."""
        try:
            st = os.stat(self._layout.data(i))
        except FileNotFoundError:
            return False
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        if self._trusted.get(i) == key:  # same file as last verified: skip the sidecar read
            return True
        st = vouched(self._layout, self._manifest, i)
        if st is None:
            return False
        self._trusted[i] = (st.st_ino, st.st_size, st.st_mtime_ns)
        return True

    # -- fetching -------------------------------------------------------------------------------
    def _fetch_locked(self, i: int, *, prefetch: bool,
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
                f"Raise cache_limit to at least {size} bytes.")

        def install() -> None:
            target = self._layout.data(i)
            os.replace(tmp, target)
            st = os.stat(target)
            Sidecar(self._manifest.shards[i].xxh3_128, self._manifest.shards[i].bytes,
                    local_hash, st.st_size, st.st_mtime_ns, self._zstd).write(
                        self._layout.sidecar(i))
            self._fresh[i] = (st.st_ino, st.st_size, st.st_mtime_ns)  # hashed as it came in

        return self._budget.with_room(i, size, prefetch, install)

    def _reserve_rewrite(self, i: int, nbytes: int) -> str:
        shard = self._manifest.shards[i]
        path = self._budget.reserve(i, nbytes, "mat", wait=True, held=shard.bytes,
                                    what=repr(shard.path))
        if path is None:  # unreachable with wait=True; keeps the type exact
            raise CacheError(f"shard {i}: no in-flight room to materialise.")
        return path

    # -- eviction policy ----------------------------------------------------------------------------
    def _victims(self, i: int, files: list[CommittedFile], prefetch: bool) -> list[CommittedFile]:
        """Eviction candidates for admitting ``i``, best first: quarantined copies, then by policy.

        Belady: furthest next use first (never again = infinity), least recently used among
        equals; a prefetch may only evict shards needed later than ``i``. LRU: least recently
        used first; a prefetch evicts nothing but quarantined copies.
        """
        quarantined = [f for f in files if f[0] is None]
        with self._mutex:
            shards = [f for f in files
                      if f[0] is not None and f[0] != i and f[0] not in self._pins]
            if self._eviction == "lru":
                if prefetch:
                    return quarantined
                shards.sort(key=lambda f: self._last_used.get(f[0], 0))  # type: ignore[arg-type]
                return quarantined + shards
            future = self._future
            nxt = {f[0]: future.next_use(f[0]) if future is not None else math.inf  # type: ignore[arg-type]
                   for f in shards}
            mine = future.next_use(i) if future is not None else math.inf
            last = self._last_used
            if prefetch:
                shards = [f for f in shards if nxt[f[0]] > mine]
            # Furthest next use first; among equals (e.g. never needed again), least recent,
            # except among shards in use right now (a timed future cannot tell which is read
            # next): most recent first, which keeps a fixed subset under a budget smaller than
            # the working set instead of cycling through all of them (LRU's worst case).
            now = future.cursor if future is not None and future.timed else None

            def rank(f: CommittedFile) -> tuple[float, int]:
                used = last.get(f[0], 0)  # type: ignore[arg-type]
                return -nxt[f[0]], (-used if nxt[f[0]] == now else used)  # type: ignore[index]

            shards.sort(key=rank)
        return quarantined + shards

    def _own_pins(self, i: int) -> tuple[int, int]:
        """(count, bytes) of the shards this process pins, other than ``i``."""
        with self._mutex:
            mine = [p for p in self._pins if p != i]
        sizes = []
        for p in mine:
            with contextlib.suppress(FileNotFoundError):
                sizes.append(os.path.getsize(self._layout.data(p)))
        return len(mine), sum(sizes)

    # -- prefetching ------------------------------------------------------------------------------
    def _prefetch_loop(self) -> None:
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
                lock = FileLock(self._layout.lock(i))
                if lock.acquire(shared=False, timeout=0):
                    try:
                        declined = not self._is_present(i) and not self._fetch_locked(
                            i, prefetch=True, admitted=admitted)
                    finally:
                        lock.release()
            except (StokerError, OSError) as exc:  # the foreground request retries and reports
                if not self._closed.is_set():  # else cancelled by close(): nothing to report
                    log.warning("prefetch of shard %d failed (%s: %s); it will be fetched on "
                                "demand", i, type(exc).__name__, self._scrub(str(exc)))
                    with self._mutex:
                        self._prefetch_failed.add(i)
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
        with self._mutex:
            if self._future is None or self._closed.is_set():
                return None
            for s in self._future.upcoming(self._prefetch_ahead):
                if s in self._claimed or s in self._pins or s in self._prefetch_failed:
                    continue
                if not self._is_present(s):
                    self._claimed.add(s)
                    return s
        return None


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


def _reopen(manifest: Manifest, cache_dir: str, options: dict[str, Any]) -> ShardCache:
    return ShardCache(manifest, cache_dir, **options)


def _make_fetcher(root: str, storage_options: Mapping[str, Any] | None,
                  policy: RetryPolicy) -> Fetcher:
    scheme = urlsplit(root).scheme.lower() if is_url(root) else ""
    if scheme in ("http", "https"):
        return HttpFetcher(storage_options, policy)
    if scheme in ("", "file"):
        return LocalFetcher()
    return FsspecFetcher(storage_options)


def _stat_key(path: str) -> tuple[int, int, int] | None:
    """(inode, size, mtime) of ``path``, or None if it does not exist."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"
