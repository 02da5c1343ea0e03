"""Cross-process file locks that die with their holder (``fcntl.flock``).

The kernel drops a ``flock`` lock when the last descriptor of its open file description is
closed, which includes the holder being killed, so a crashed process can never leave a shard
locked. Locks taken through different ``open()`` calls conflict even inside one process,
which is what lets a pin (shared) in one thread block an eviction (exclusive) in another.
Lock files are never deleted: deleting one while another process waits on it would let two
holders lock two different inodes under one name.

A forked child inherits the descriptors, and with them the locks (``flock`` belongs to the
open file description, which the child shares): a child that lives on would hold its parent's
locks for its whole life, and deadlock on them. So every child closes, right after ``fork``,
the descriptors of the locks its parent held; the parent keeps its locks. The at-fork hook
that does it is installed with the first lock, not at import.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time

__all__ = ["FileLock"]

_OPEN_FDS: set[int] = set()  # descriptors of the locks this process holds
_OPEN_MUTEX = threading.Lock()


def _close_inherited() -> None:
    """In a forked child: drop the parent's lock descriptors (the parent keeps its locks)."""
    for fd in list(_OPEN_FDS):
        try:
            os.close(fd)
        except OSError:
            pass
    _OPEN_FDS.clear()


_HOOKED: list[bool] = []  # the at-fork hook is installed (see _install_fork_hook)


def _install_fork_hook() -> None:
    """Close the parent's lock descriptors in every forked child, from the first lock this
    process opens on (nothing is installed at import: before that there is nothing to close).
    Called under ``_OPEN_MUTEX``, so two first locks install it once."""
    if not _HOOKED:
        os.register_at_fork(before=_OPEN_MUTEX.acquire, after_in_parent=_OPEN_MUTEX.release,
                            after_in_child=lambda: (_OPEN_MUTEX.release(), _close_inherited()))
        _HOOKED.append(True)


class FileLock:
    """One ``flock`` lock on ``path``; shared or exclusive, blocking, timed or non-blocking."""

    __slots__ = ("_fd", "_pid", "path", "shared")

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._pid = 0
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
        if self._fd is not None and self._pid != os.getpid():
            self._fd = None  # inherited through fork: the child closed that descriptor
        fresh = self._fd is None
        if fresh:
            with _OPEN_MUTEX:
                _install_fork_hook()
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                _OPEN_FDS.add(self._fd)
            self._pid = os.getpid()
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
            if self._pid != os.getpid():
                return  # inherited through fork: closed in the child already, not ours
            with _OPEN_MUTEX:
                _OPEN_FDS.discard(fd)
                os.close(fd)  # closing the only descriptor releases the flock
