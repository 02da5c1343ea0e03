"""Stopping a background thread pool from wherever a loader is closed.

A loader's ``close`` stops its thread pools (record builds and saves, staging, decoding
ahead) with ``ThreadPoolExecutor.shutdown(wait=False)``, which takes the pool's
``_shutdown_lock``. ``submit`` holds that same lock, and a garbage collection that starts
inside ``submit`` (it allocates) may run an unreachable ``DataLoader.__del__`` on that very
thread: ``close`` then waits for a lock its own thread holds, forever. Seen in the test
suite: a record-build thread submitting a save collected a finished test's loader. So
:func:`stop` never waits for that lock: when it is taken, the shutdown is handed to a
short-lived thread (which gets it as soon as ``submit`` returns).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["stop"]


def stop(pool: ThreadPoolExecutor, cancel_futures: bool = True) -> None:
    """``pool.shutdown(wait=False, cancel_futures=...)`` without ever blocking the caller."""
    lock = getattr(pool, "_shutdown_lock", None)  # CPython's; without it, just shut down
    if lock is not None:
        if not lock.acquire(blocking=False):  # a submit holds it, maybe this thread's own
            threading.Thread(target=pool.shutdown, name="stoker-stop", daemon=True,
                             kwargs={"wait": False, "cancel_futures": cancel_futures}).start()
            return
        lock.release()
    pool.shutdown(wait=False, cancel_futures=cancel_futures)
