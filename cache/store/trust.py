"""What this process may believe about committed shard files without reading them again.

A sidecar vouches for a file by size and mtime, which bit rot keeps, so a file is re-hashed
each time it is handed out (:func:`~stoker.cache.store.repair.content_problem`), except once
right after this process verified it in full. Two memories, both keyed by the file's
``(inode, size, mtime)`` so that a file replaced since is never taken for the one remembered:
files whose sidecar vouched for them (no sidecar read next time) and files verified in full
and not handed out since (no re-hash next time).
"""

from __future__ import annotations

import os

from stoker.cache.stats import _Counters
from stoker.cache.store.budget import Budget
from stoker.cache.store.layout import Layout
from stoker.cache.store.repair import content_problem, quarantine_committed, vouched
from stoker.manifest import Manifest

__all__ = ["FileTrust"]


class FileTrust:
    """Judges shard files of one dataset's cache directory, remembering what it verified."""

    def __init__(self, layout: Layout, manifest: Manifest, budget: Budget,
                 counters: _Counters) -> None:
        self._layout = layout
        self._manifest = manifest
        self._budget = budget
        self._counters = counters
        self._trusted: dict[int, tuple[int, int, int]] = {}
        # (inode, size, mtime) of files this process verified in full (downloaded, or
        # re-hashed under the exclusive lock) and has not handed out since: the next pin
        # skips the re-hash once (see intact).
        self._fresh: dict[int, tuple[int, int, int]] = {}

    def verified(self, i: int, st: os.stat_result) -> None:
        """Shard ``i``'s committed file ``st`` was hashed in full as it came in."""
        self._fresh[i] = (st.st_ino, st.st_size, st.st_mtime_ns)

    def is_present(self, i: int) -> bool:
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

    def intact(self, i: int, *, repair: bool = False) -> bool:
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


def _stat_key(path: str) -> tuple[int, int, int] | None:
    """(inode, size, mtime) of ``path``, or None if it does not exist."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)

