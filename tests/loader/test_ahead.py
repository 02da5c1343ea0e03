"""Work done ahead (stoker.loader.jit.ahead.Ahead): jobs by key in background threads; a
reader waiting for one gets its error, and with ``help`` runs queued jobs meanwhile."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError

import pytest

from stoker.loader.jit.ahead import Ahead


def test_a_helping_reader_runs_queued_jobs_and_gets_its_own_jobs_error() -> None:
    ahead = Ahead("stoker-test")
    release = threading.Event()
    ran: dict[str, str] = {}

    def job(key: str, fail: bool = False) -> None:
        ran[key] = threading.current_thread().name
        if key == "a":
            release.wait(5)
        if fail:
            raise ValueError(f"job {key} failed")

    try:
        ahead.start("a", lambda: job("a", fail=True))  # the background thread takes it
        for _ in range(500):
            if "a" in ran:
                break
            threading.Event().wait(0.01)
        ahead.start("b", lambda: job("b"))
        ahead.start("c", lambda: job("c"))
        threading.Timer(0.2, release.set).start()
        with pytest.raises(ValueError, match="job a failed"):
            ahead.wait("a", help=True)  # runs b and c here while a is held, then a's error
        me = threading.current_thread().name
        assert ran["a"].startswith("stoker-test") and ran["b"] == ran["c"] == me
        ahead.wait("b")  # done: nothing to wait for
    finally:
        ahead.close()


def test_a_reader_of_a_job_dropped_at_close_gets_cancelled() -> None:
    ahead = Ahead("stoker-test")
    hold = threading.Event()
    ahead.start("a", lambda: hold.wait(5))
    ahead.start("b", lambda: None)  # queued behind a
    pending = ahead._pending["b"]
    ahead.close()
    hold.set()
    with pytest.raises(CancelledError):
        pending.future.result(timeout=5)
    ahead.wait("b")  # closed: returns at once
