"""Cases 12 and 13 of issue 8: worker processes killed or stopped mid-epoch.

CI trial counts: 8 kills (2 per pin_memory x persistent_workers combination; full: 52, 13 per
combination) and one SIGSTOP per mode. Also: process workers reading a remote dataset through
the cache (the cache's locks must not be inherited by the forked workers).
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import time
from pathlib import Path

import pytest
from fault_helpers import Figures, Stopwatch, expected_ids, ids_of, make_dataset, trials

from stoker.loader import DataLoader, WorkerOptions
from stoker.loader.errors import LoaderTimeoutError
from stoker.loader.ledger.reader import read_ledger

KILLS = trials(2, 13)
KW = dict(batch_size=8, shuffle=True, seed=12)


def _slow(batch):  # a Python transform, so a kill often lands mid-batch
    time.sleep(0.004)
    return batch


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("workers") / "ds"
    make_dataset(root, [60, 70, 80, 90, 100])
    return root


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("pin_memory,persistent", list(itertools.product([False, True], repeat=2)))
def test_killed_worker_is_restarted_and_the_sequence_continues(
        pin_memory: bool, persistent: bool, dataset: Path, after_trial, tmp_path: Path) -> None:
    epochs = 2 if persistent else 1
    expected = [expected_ids(dataset, e, **KW) for e in range(epochs)]
    figures = Figures(f"12 SIGKILL a worker (pin={pin_memory}, persistent={persistent})")
    rng = random.Random(f"{pin_memory}{persistent}")
    for t in range(KILLS):
        figures.start()
        ledger = tmp_path / f"t{t}.ledger"
        dl = DataLoader(dataset, num_workers=2, transform=_slow, pin_memory=pin_memory,
                        persistent_workers=persistent, ledger=ledger,
                        workers=WorkerOptions(mode="process"), **KW)
        steps = len(dl)
        kill_epoch, kill_step = rng.randrange(epochs), rng.randrange(1, steps - 4)
        worst = 0.0
        for epoch in range(epochs):
            dl.set_epoch(epoch)
            got: list[int] = []
            for k, batch in enumerate(_timed(dl)):
                b, waited = batch
                got.extend(ids_of([b]))
                if (epoch, k) == (kill_epoch, kill_step):
                    victim = rng.choice(dl._pool.pids)
                    os.kill(victim, signal.SIGKILL)
                    time.sleep(0.05)
                    killed_at = k
                if epoch == kill_epoch and k > kill_step:
                    worst = max(worst, waited)
            assert got == expected[epoch], \
                f"trial {t}: the sequence changed after killing a worker at step {killed_at}"
        del b, batch  # the last batch's shared-memory tensors
        dl.close()
        events = [e for e in read_ledger(ledger).events if e["kind"] == "worker_restart"]
        assert len(events) == 1 and events[0]["exitcode"] == -signal.SIGKILL, events
        after_trial(ledger=ledger, events=["worker_restart"])
        figures.trial(worst)
    figures.write()


def _timed(dl):
    it = iter(dl)
    while True:
        t0 = time.monotonic()
        try:
            b = next(it)
        except StopIteration:
            return
        yield b, time.monotonic() - t0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("persistent", [False, True])
def test_stopped_worker_is_a_timeout_naming_the_batch(persistent: bool, dataset: Path,
                                                      after_trial) -> None:
    timeout = 2.0
    figures = Figures(f"13 SIGSTOP a worker (persistent={persistent})")
    figures.start()
    dl = DataLoader(dataset, num_workers=2, transform=_slow, timeout=timeout,
                    persistent_workers=persistent,
                    workers=WorkerOptions(mode="process"), **KW)
    it = iter(dl)
    for _ in range(3):
        next(it)
    victims = dl._pool.pids
    os.kill(victims[0], signal.SIGSTOP)
    try:
        with Stopwatch() as sw, pytest.raises(LoaderTimeoutError) as info:
            for _ in range(len(dl)):
                next(it)
    finally:
        os.kill(victims[0], signal.SIGCONT)
        dl.close()
    assert "batch (" in str(info.value) and f"timeout={timeout}" in str(info.value)
    after_trial()
    figures.trial(sw.s)
    figures.write()


@pytest.mark.remote
@pytest.mark.timeout(120)
def test_process_workers_read_through_the_cache(served, fault_server, after_trial,
                                                tmp_path: Path) -> None:
    root, manifest = served([50, 60, 70, 80, 90])
    expected = expected_ids(root, **KW)
    for persistent in (False, True):
        cache = tmp_path / f"c{persistent}"
        dl = DataLoader(fault_server.url, num_workers=2, persistent_workers=persistent,
                        cache=cache, workers=WorkerOptions(mode="process"),
                        **KW)
        assert ids_of(dl) == expected
        dl.set_epoch(0)
        assert ids_of(dl) == expected
        dl.close()
        after_trial(caches=[(cache, manifest)])
    shards = [r for r in fault_server.requests() if r.path.startswith("/shards/")]
    assert len(shards) == 2 * manifest.num_shards  # once per cache directory
