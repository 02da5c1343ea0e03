"""The fork gate (stoker.loader.jit.fork_gate): a worker process is never forked while one of
stoker's background threads is inside pyarrow or holds a source's lock.

Seen before the gate (issue 15): about 1 run in 60 of bench/workers_bench.py left a forked
worker waiting forever in ``pyarrow.ipc.open_file`` because a warm-up thread of the parent was
inside pyarrow at the fork. A lock held at a fork cannot be provoked on demand, so these tests
check the gate's contract with events: a fork waits for a running unit, a unit waits for a
fork in progress, a child starts with an open gate, and a fork that gave up waiting is a
counted, logged fallback. The short waits below only ever pass when the gate holds: a broken
gate lets the event through and the test fails.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path

import pytest

from stoker.loader import DataLoader, WorkerOptions
from stoker.loader.jit import fork_gate
from stoker.loader.workers import processes

_BLOCKED = 0.3  # how long an event that the gate must hold back is watched for


def _hold_unit(inside: threading.Event, release: threading.Event) -> threading.Thread:
    def work() -> None:
        with fork_gate.unit():
            inside.set()
            release.wait(30)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    assert inside.wait(10)
    return thread


def _settles(within: float = 10.0) -> bool:
    """Whether no unit runs within ``within`` s: a background unit an earlier test left
    running (a record save) ends by itself; a leaked count never does."""
    deadline = time.monotonic() + within
    while fork_gate.running():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_fork_waits_for_the_running_unit() -> None:
    inside, release, forked = threading.Event(), threading.Event(), threading.Event()
    worker = _hold_unit(inside, release)
    calm: list[bool] = []

    def fork() -> None:
        with fork_gate.quiet(timeout=30) as ok:
            calm.append(ok)
            forked.set()

    forker = threading.Thread(target=fork, daemon=True)
    forker.start()
    assert not forked.wait(_BLOCKED)  # the unit still runs: no fork yet
    release.set()
    assert forked.wait(10)
    forker.join(10)
    worker.join(10)
    assert calm == [True] and not worker.is_alive()
    assert _settles()  # the unit's count went back (not leaked)


def test_a_unit_waits_for_the_fork_in_progress() -> None:
    started = threading.Event()

    def work() -> None:
        with fork_gate.unit():
            started.set()

    with fork_gate.quiet(timeout=1) as calm:
        assert calm
        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        assert not started.wait(_BLOCKED)  # held back while the fork is in progress
    assert started.wait(10)
    thread.join(10)


def test_a_unit_inside_a_unit_does_not_wait_for_the_fork_that_waits_for_it() -> None:
    """A thread inside a unit may enter another (stoker.loader.jit.kernel.materialize is one,
    called from background jobs that are units): held back, it would hold the fork back
    until the fork's timeout."""
    inside, nest, nested = threading.Event(), threading.Event(), threading.Event()

    def work() -> None:
        with fork_gate.unit():
            inside.set()
            nest.wait(10)
            with fork_gate.unit():
                nested.set()

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    assert inside.wait(10)
    timer = threading.Timer(_BLOCKED, nest.set)  # once the fork below waits for the unit
    timer.start()
    t0 = time.monotonic()
    with fork_gate.quiet(timeout=30) as calm:
        waited = time.monotonic() - t0
    worker.join(10)
    assert calm and nested.is_set() and waited < 10
    assert _settles()


def test_the_forking_threads_own_unit_does_not_wait_for_its_fork() -> None:
    """The consumer opens the shards of the workers' first tasks inside the gate (and may
    make the kernels there, a unit): it must not wait for itself."""
    done = threading.Event()

    def fork() -> None:
        with fork_gate.quiet(timeout=1) as calm:
            assert calm
            with fork_gate.unit():
                pass
        done.set()

    thread = threading.Thread(target=fork, daemon=True)
    thread.start()
    assert done.wait(10)
    assert _settles()


def test_helpers_of_the_forking_thread_do_not_wait_for_its_fork() -> None:
    """The loader opens the workers' first shards on a few threads inside the gate; a unit
    one of them enters (a kernel made, a build) must not wait for the fork that waits for
    them."""
    from concurrent.futures import ThreadPoolExecutor

    def helper(exempt: bool) -> bool:
        with fork_gate.on_behalf(exempt), fork_gate.unit():
            return True

    done = threading.Event()

    def fork() -> None:
        with fork_gate.quiet(timeout=1) as calm:
            assert calm and fork_gate.exempt()
            with ThreadPoolExecutor(2) as pool:
                assert list(pool.map(helper, [fork_gate.exempt()] * 4)) == [True] * 4
        done.set()

    thread = threading.Thread(target=fork, daemon=True)
    thread.start()
    assert done.wait(10)
    assert not fork_gate.exempt() and _settles()


def test_a_fork_gives_up_after_its_timeout_and_says_so() -> None:
    inside, release = threading.Event(), threading.Event()
    worker = _hold_unit(inside, release)
    try:
        with fork_gate.quiet(timeout=0.05) as calm:
            assert calm is False
    finally:
        release.set()
        worker.join(10)


def _child_unit(done: "multiprocessing.synchronize.Event") -> None:
    with fork_gate.unit():  # the parent forked inside quiet(): the child's gate must be open
        done.set()


@pytest.mark.timeout(60)
def test_a_child_forked_inside_the_gate_starts_with_an_open_gate() -> None:
    ctx = multiprocessing.get_context("fork")
    done = ctx.Event()
    with fork_gate.quiet(timeout=1):
        child = ctx.Process(target=_child_unit, args=(done,))
        child.start()
    child.join(20)
    if child.is_alive():
        child.kill()
        child.join()
    assert child.exitcode == 0 and done.is_set()


@pytest.mark.timeout(120)
def test_a_busy_fork_is_a_counted_fallback(dataset: Path, monkeypatch) -> None:
    monkeypatch.setattr(processes, "_FORK_WAIT", 0.05)
    inside, release = threading.Event(), threading.Event()
    worker = _hold_unit(inside, release)
    try:
        dl = DataLoader(dataset, batch_size=50, num_workers=2,
                        workers=WorkerOptions(mode="process"))
        rows = sum(len(b["id"]) for b in dl)
        dl.close()
    finally:
        release.set()
        worker.join(10)
    assert rows == 615
    assert dl.stats.fallbacks.get("fork_busy") == 2  # one per forked worker
