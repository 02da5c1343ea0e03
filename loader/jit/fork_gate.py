"""The fork gate: stoker's background threads and the forks of process workers take turns.

``fork`` copies a process's memory but only the forking thread: a lock that another thread
held at that instant stays held in the child forever. Stoker's background threads (warm-ups,
row-major record builders and savers, staging) call into pyarrow, whose locks are not reset
in a child; a worker process forked while one of them was inside pyarrow hung in its first
``pyarrow.ipc.open_file`` (about 1 run in 60 of bench/workers_bench.py). Python's own import
locks have the same hazard (stoker.loader.workers.processes settles the imports).

So each stretch of background work that touches such libraries runs inside :func:`unit`,
and a process worker is forked inside :func:`quiet`, which waits until no unit is running and
holds new ones back until the fork is done. Units are short (one shard's records, one staged
round, one warm-up shard), so a fork waits for at most one of each. A unit never waits for
the forking thread, but a bound still keeps a stuck one from stalling the loader: after
``timeout`` seconds :func:`quiet` forks anyway and says so (the caller counts and logs it).

Nothing happens at import: the at-fork hook that resets the gate in a child is installed by
the first :func:`unit` or :func:`quiet`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Iterator

__all__ = ["exempt", "on_behalf", "quiet", "running", "unit"]

_cond = threading.Condition()
_running = 0  # units in progress
_forking = 0  # quiet() blocks in progress (nested or concurrent forks)
_hooked: list[bool] = []
_inside = threading.local()  # .depth: units and quiet blocks this thread is inside


def _hook() -> None:
    """Install the child's reset once per process (under ``_cond``)."""
    if not _hooked and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_reset_in_child)
        _hooked.append(True)


def _reset_in_child() -> None:
    # the child has none of its parent's threads, so none of their units, and it was forked
    # inside quiet(): start with a fresh, open gate (the old condition's lock may be held)
    global _cond, _running, _forking
    _cond = threading.Condition()
    _running = 0
    _forking = 0
    _inside.depth = 0


@contextlib.contextmanager
def unit() -> Iterator[None]:
    """A stretch of background work that a fork must not split; waits while a fork is in
    progress, unless this thread is inside a unit already (the fork waits for that one) or
    is the forking thread itself (inside :func:`quiet`: its unit ends before its fork)."""
    global _running
    with _cond:
        _hook()
        while _forking and not _depth():
            _cond.wait()
        _running += 1
    _inside.depth = _depth() + 1
    try:
        yield
    finally:
        _inside.depth -= 1
        with _cond:
            _running -= 1
            _cond.notify_all()


@contextlib.contextmanager
def quiet(timeout: float = 60.0) -> Iterator[bool]:
    """Wait until no :func:`unit` runs (at most ``timeout`` s) and keep new ones from starting
    for the duration of the block (the fork). Yields whether the gate was quiet: ``False``
    means a unit was still running after ``timeout`` and the fork goes ahead regardless."""
    global _forking
    deadline = time.monotonic() + timeout
    with _cond:
        _hook()
        _forking += 1
        try:
            while _running:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                _cond.wait(left)
            calm = _running == 0
        except BaseException:
            _forking -= 1
            _cond.notify_all()
            raise
    _inside.depth = _depth() + 1
    try:
        yield calm
    finally:
        _inside.depth -= 1
        with _cond:
            _forking -= 1
            _cond.notify_all()


def exempt() -> bool:
    """Whether this thread's units do not wait for a fork: it is inside a unit or is the
    forking thread (see :func:`unit`)."""
    return _depth() > 0


@contextlib.contextmanager
def on_behalf(exempt_caller: bool) -> Iterator[None]:
    """In a helper thread whose caller waits for it (a pool's task): its units wait for a
    fork only when the caller's would (``exempt_caller``: :func:`exempt` in the caller).
    The caller outlasts the helper, so the caller's unit, or its fork, comes after."""
    if not exempt_caller:
        yield
        return
    _inside.depth = _depth() + 1
    try:
        yield
    finally:
        _inside.depth -= 1


def _depth() -> int:
    """Units and quiet blocks this thread is inside."""
    return getattr(_inside, "depth", 0)


def running() -> int:
    """How many units are in progress in this process (for tests and statistics)."""
    return _running
