"""Judging committed shard files: start-up repair, the re-hash on open, quarantine.

Start-up repair removes what a crash left in a cache directory and keeps what is vouched for.
Every check runs under the shard's lock, tried without waiting: a file whose lock another
process holds is being written or read right now and is left alone; a file whose lock is free
is judged. A crashed writer's lock is free (the kernel released it), so its leftovers go.

A sidecar vouches for a file by size and mtime only, which bit rot (or a tool that rewrites a
file and restores its mtime) leaves unchanged; so :func:`content_problem` re-hashes a file
whenever the cache hands it out again, and a file that fails either check goes the same way,
:func:`quarantine_committed`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from typing import Iterator

from stoker.cache.lock import FileLock
from stoker.cache.stats import _Counters
from stoker.cache.store.layout import Layout
from stoker.cache.store.sidecar import Sidecar
from stoker.manifest import Manifest, hash_file

__all__ = ["content_problem", "quarantine_committed", "repair", "vouched"]

log = logging.getLogger("stoker.cache")


def vouched(layout: Layout, manifest: Manifest, i: int) -> os.stat_result | None:
    """Stat of shard ``i``'s committed file if its sidecar vouches for it, else None."""
    try:
        st = os.stat(layout.data(i))
    except FileNotFoundError:
        return None
    side = Sidecar.read(layout.sidecar(i))
    if side is not None and side.matches(manifest.shards[i].xxh3_128, st):
        return st
    return None


def content_problem(layout: Layout, manifest: Manifest, i: int) -> str | None:
    """Re-hash shard ``i``'s committed file: None if it still has the verified bytes.

    The expected hash is the manifest's (an uncompressed shard is stored as downloaded), or,
    for a materialised zstd shard, the local hash its sidecar recorded at commit (after the
    sidecar itself is checked against the manifest). Otherwise returns what is wrong.
    """
    shard = manifest.shards[i]
    expected, whose = shard.xxh3_128, "the manifest"
    if manifest.compression == "zstd":
        side = Sidecar.read(layout.sidecar(i))
        if side is None or side.source_xxh3_128 != shard.xxh3_128:
            return "has no sidecar for the manifest's hash"
        expected, whose = side.local_xxh3_128, "its sidecar"
    try:
        digest = hash_file(layout.data(i))[0]
    except OSError as exc:  # e.g. EIO from a failing disk: as bad as wrong bytes
        return f"could not be read ({type(exc).__name__}: {exc})"
    if digest != expected:
        return (f"has xxh3-128 {digest} where {whose} says {expected} (its bytes changed on "
                "disk: bit rot, or a rewrite that kept the size and mtime)")
    return None


def repair(layout: Layout, manifest: Manifest, counters: _Counters) -> None:
    """Remove stale temp files, foreign files, unverifiable shards and orphan sidecars."""
    n = manifest.num_shards
    for entry in os.scandir(layout.tmp):
        info = Layout.temp_info(entry.name)
        if info is None or info[0] >= n:
            _remove(entry.path, "foreign temp file", counters)
            continue
        with _try_lock(layout, info[0]) as free:
            if free:  # nobody is writing this shard: the temp file is a crash leftover
                _remove(entry.path, "stale temp file", counters)
    for entry in os.scandir(layout.shards):
        idx = Layout.data_index(entry.name)
        if idx is None or idx >= n or not entry.is_file():
            _remove(entry.path, "foreign file", counters)
            continue
        with _try_lock(layout, idx) as free:
            if free and vouched(layout, manifest, idx) is None:
                try:
                    verdict = _readopt(layout, manifest, idx)
                except FileNotFoundError:  # evicted by another process since the listing
                    continue
                if verdict == "corrupt":  # the right size, the wrong bytes: bit rot, a bad copy
                    if quarantine_committed(layout, idx, "fails verification at start-up",
                                            counters):
                        counters.add("repaired")
                elif verdict != "kept":
                    _remove(entry.path, "unverified shard file", counters)
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(layout.sidecar(idx))
    for entry in os.scandir(layout.meta):
        writing = Layout.meta_temp_index(entry.name)
        if writing is not None:  # a sidecar being written under its shard's lock
            with _try_lock(layout, writing) as free:
                if free:
                    _remove(entry.path, "stale sidecar temp file", counters)
            continue
        idx = Layout.meta_index(entry.name)
        if idx is None or not os.path.exists(layout.data(idx)):
            _remove(entry.path, "orphan sidecar", counters)


def _readopt(layout: Layout, manifest: Manifest, i: int) -> str:
    """Re-hash a committed file its sidecar no longer vouches for; keep it if it verifies.

    Returns ``"kept"``, ``"corrupt"`` (it should verify by its size but its hash is wrong) or
    ``"unverifiable"`` (nothing to check it against: removed and fetched again).

    Raises:
        FileNotFoundError: another process evicted it after the directory was listed.
    """
    path = layout.data(i)
    st = os.stat(path)
    if st.st_size == 0:
        return "unverifiable"
    side = Sidecar.read(layout.sidecar(i))
    shard = manifest.shards[i]
    materialised = manifest.compression == "zstd"
    if side is not None and side.source_xxh3_128 == shard.xxh3_128 and side.size == st.st_size:
        expected = side.local_xxh3_128  # e.g. mtime touched by a copy tool
    elif side is None and not materialised and st.st_size == shard.bytes:
        expected = shard.xxh3_128  # committed but the sidecar was never written
    else:
        return "unverifiable"
    if hash_file(path)[0] != expected:
        return "corrupt"
    Sidecar(shard.xxh3_128, shard.bytes, expected, st.st_size, st.st_mtime_ns,
            materialised).write(layout.sidecar(i))
    return "kept"


def quarantine_committed(layout: Layout, i: int, why: str, counters: _Counters) -> bool:
    """Set shard ``i``'s corrupt committed file aside and drop its sidecar.

    The one path for a committed file that fails verification, whether start-up repair or
    the re-hash on open (:class:`~stoker.cache.ShardCache`) found it: the file is renamed
    into ``quarantine/`` (still counted by the budget, first to be evicted, kept for
    inspection), so the shard is absent and its next request fetches it again. The caller
    holds the shard's lock exclusive. Returns False if the file was already gone.
    """
    path = layout.data(i)
    log.warning("shard %d's cached copy %s %s; quarantined, it will be fetched again",
                i, path, why)
    try:
        os.replace(path, layout.quarantined(i))
    except FileNotFoundError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(layout.sidecar(i))
    counters.add("quarantines")
    return True


@contextlib.contextmanager
def _try_lock(layout: Layout, i: int) -> Iterator[bool]:
    lock = FileLock(layout.lock(i))
    try:
        yield lock.acquire(timeout=0)
    finally:
        lock.release()


def _remove(path: str, why: str, counters: _Counters) -> None:
    log.warning("cache repair: removing %s %s", why, path)
    with contextlib.suppress(FileNotFoundError):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    counters.add("repaired")
