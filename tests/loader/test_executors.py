"""Stopping a loader's thread pools never waits on the lock ``submit`` holds
(stoker.loader.jit.executors): a garbage collection inside ``submit`` can close a loader on that
very thread."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from stoker.loader.jit.executors import stop


def test_stopping_a_pool_from_inside_its_submit_does_not_deadlock() -> None:
    pool = ThreadPoolExecutor(1)
    pool.submit(lambda: None).result()
    done = threading.Event()

    def closer() -> None:
        with pool._shutdown_lock:  # as submit holds it when a collection runs __del__
            stop(pool)  # shutdown() itself would wait here forever
        done.set()

    t = threading.Thread(target=closer, daemon=True)
    t.start()
    assert done.wait(30), "stop() waited for the lock its own thread holds"
    for worker in list(pool._threads):  # and the pool does stop, once the lock is free
        worker.join(30)
        assert not worker.is_alive()


def test_stopping_a_free_pool_cancels_what_waits() -> None:
    pool = ThreadPoolExecutor(1)
    gate = threading.Event()
    running = pool.submit(gate.wait)
    waiting = pool.submit(lambda: None)
    stop(pool)
    gate.set()
    running.result(30)
    assert waiting.cancelled()
