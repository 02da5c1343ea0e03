"""Files this node hashed and found as indexed: not hashed again while ``stat`` says unchanged.

An indexed file is read in place only after its size and xxh3-128 matched the index
(:meth:`stoker.loader.read.indexed.source.IndexSource.verify`), which reads the whole file,
in every process. A later run whose row groups' records are stored on the node reads only
those records and two checked columns of each group, so the hash was most of its reading:
~140 ms for a 0.8 GB W1 file in page cache, the whole file from disk once it was evicted,
and for a data lake every file a job touches.

So once a file hashed right, the node keeps a note beside the stored records (``<digest of
path and hash>.ok``, one line) holding what any write to the file changes: device, inode,
size, and modification and status-change times in nanoseconds (a user can set a file's mtime
back, not its ctime). While ``stat`` still gives exactly that line, the file is not hashed
again; a file rewritten in place has a new ctime and is hashed, and refused, again. The note
is written only when ``stat`` was the same before and after the hash (no write meanwhile)
and the file's ctime is more than :data:`_SETTLED_NS` old: file times come from a coarse
clock (a few ms), so a write right after the hash could leave the same times behind (git's
"racy clean" entries, handled the same way). ``stoker verify`` always hashes.

The node cache's sidecars (stoker.cache.store.sidecar) vouch for a fetched shard by size and
mtime and the cache re-hashes it at every hand-out anyway; an indexed file was hashed once per
process, so this note vouches for it across processes and adds what a rewrite cannot restore
(inode, ctime). What ``stat`` cannot see is a byte that rots in place: stored group records
are still compared with the file's own columns before they are served
(stoker.loader.read.indexed.group_records), and ``stoker verify`` finds the rest.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import xxhash

from stoker.loader.read.staged_files import write_note

__all__ = ["HashedFiles"]

log = logging.getLogger("stoker.loader")

_SUFFIX = ".ok"
_SETTLED_NS = 2_000_000_000  # a file changed more recently than this is not noted


def _line(st: os.stat_result) -> str:
    return f"{st.st_dev} {st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}"


class HashedFiles:
    """Notes of files hashed right, in ``root`` (the node's records directory)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._warned = False

    def _path(self, path: str, digest: str) -> str:
        key = f"{os.path.realpath(path)}\0{digest}".encode()
        return os.path.join(self.root, xxhash.xxh3_128_hexdigest(key) + _SUFFIX)

    def known(self, path: str, digest: str, st: os.stat_result) -> bool:
        """Whether ``path``, now ``st``, is unchanged since it hashed to ``digest`` here."""
        try:
            return Path(self._path(path, digest)).read_text() == _line(st)
        except (OSError, UnicodeDecodeError):
            return False

    def remember(self, path: str, digest: str, before: os.stat_result) -> None:
        """``path`` hashed to ``digest`` and was ``before`` when the hash began; kept only if
        it still is (written atomically). Failing to keep it costs the next process a hash,
        nothing else: logged once."""
        try:
            if _line(os.stat(path)) != _line(before) or \
                    time.time_ns() - before.st_ctime_ns <= _SETTLED_NS:
                return
            os.makedirs(self.root, exist_ok=True)
            write_note(self._path(path, digest), _line(before))
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("indexed files will be hashed again by later processes: cannot "
                            "note %s as verified in %s (%s)", path, self.root, exc)
