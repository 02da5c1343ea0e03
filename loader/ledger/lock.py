"""One live writer per ledger file: an exclusive ``flock`` on ``FILE.lock`` beside it.

Two loaders appending to one ledger interleave their frames: steps land in the other writer's
segment and the audit sees a partial epoch instead of a lost one. So a writer takes an
exclusive lock before it reads or truncates the file, holds it until ``close()``, and a second
writer is refused with the holder's pid, host and start time. The lock is a kernel ``flock``
(stoker.cache.lock.FileLock): it vanishes with its holder, so a killed loader never leaves its
ledger locked, and forked worker processes close the descriptor so they cannot hold it.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from stoker.cache.lock import FileLock
from stoker.loader.ledger.format import LedgerError

__all__ = ["lock_ledger"]


def lock_ledger(path: Path) -> FileLock:
    """The held lock of the ledger file ``path``; :class:`LedgerError` if another writer has it."""
    lock_path = f"{path}.lock"
    lock = FileLock(lock_path)
    try:
        got = lock.acquire(shared=False, timeout=0)
    except OSError as exc:
        raise LedgerError(f"{path}: cannot create the ledger's lock file {lock_path} "
                          f"({exc.strerror or exc}); pass a writable ledger path.") from None
    if not got:
        try:
            holder = Path(lock_path).read_text(encoding="utf-8").strip() or "unknown"
        except OSError:
            holder = "unknown"
        raise LedgerError(
            f"{path}: another loader is writing this ledger now ({holder}); two writers would "
            "interleave their records and lose steps. Give this loader its own ledger path, or "
            "close the other loader first (a killed one releases the ledger by itself).")
    try:
        with open(lock_path, "w", encoding="utf-8") as f:
            f.write(f"pid {os.getpid()} on {socket.gethostname()}, since "
                    f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n")
    except OSError:
        pass  # the lock itself is held; only the courtesy note for a refused writer is lost
    return lock
