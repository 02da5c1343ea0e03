"""Cross-process file locks that die with their holder (``fcntl.flock``).

The kernel drops a ``flock`` lock when the last descriptor of its open file description is
closed, which includes the holder being killed, so a crashed process can never leave a shard
locked. Locks taken through different ``open()`` calls conflict even inside one process,
which is what lets a pin (shared) in one thread block an eviction (exclusive) in another.
Lock files are never deleted: deleting one while another process waits on it would let two
holders lock two different inodes under one name.
"""

from __future__ import annotations

import fcntl
import os
import time

__all__ = ["FileLock"]


class FileLock:
    """One ``flock`` lock on ``path``; shared or exclusive, blocking, timed or non-blocking."""

    __slots__ = ("_fd", "path", "shared")

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self.shared = False

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, *, shared: bool = False, timeout: float | None = None) -> bool:
        """Take the lock; ``timeout=0`` tries once, ``None`` waits forever. True when held.

        Acquiring while already held converts the lock; stoker only ever converts exclusive
        to shared. The kernel does not convert atomically (another process may take the lock
        in between), so the caller re-checks whatever the lock protects after converting.
        """
        fresh = self._fd is None
        if fresh:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        op = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.001
        while True:
            try:
                fcntl.flock(self._fd, op | fcntl.LOCK_NB)
                self.shared = shared
                return True
            except BlockingIOError:
                pass
            if deadline is not None and time.monotonic() >= deadline:
                if fresh:
                    self.release()
                return False
            # Polling instead of a blocking flock keeps threads interruptible by close().
            time.sleep(pause)
            pause = min(pause * 2, 0.02)

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the only descriptor releases the flock
