"""Start-up repair: remove what a crash left in a cache directory, keep what is vouched for.

Every check runs under the shard's lock, tried without waiting: a file whose lock another
process holds is being written or read right now and is left alone; a file whose lock is free
is judged. A crashed writer's lock is free (the kernel released it), so its leftovers go.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from typing import Iterator

from stoker.cache.layout import Layout
from stoker.cache.lock import FileLock
from stoker.cache.sidecar import Sidecar
from stoker.cache.stats import _Counters
from stoker.manifest import Manifest, hash_file

__all__ = ["repair", "vouched"]

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
                verdict = _readopt(layout, manifest, idx)
                if verdict == "corrupt":  # the right size, the wrong bytes: bit rot, a bad copy
                    _quarantine(layout, idx, entry.path, counters)
                elif verdict != "kept":
                    _remove(entry.path, "unverified shard file", counters)
                with contextlib.suppress(FileNotFoundError):
                    if verdict != "kept":
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


def _quarantine(layout: Layout, i: int, path: str, counters: _Counters) -> None:
    """Set a corrupt committed file aside (quarantined copies are the first to be evicted)."""
    log.warning("cache repair: shard %d's cached copy %s fails verification; quarantined, it "
                "will be fetched again", i, path)
    with contextlib.suppress(FileNotFoundError):
        os.replace(path, layout.quarantined(i))
        counters.add("quarantines")
        counters.add("repaired")


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
