"""Cases 14, 15 and 16 of issue 8: a killed training process resumes exactly; chained resumes;
open/close cycles leak nothing.

CI trial counts: 4 kills of the main process (full: 50), 10 chained resumes per worker mode
(as the issue asks), 400 thread-mode and 20 process-mode open/close cycles (full: 1,000 + 50).
"""

from __future__ import annotations

import gc
import json
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from fault_helpers import Figures, Stopwatch, ids_of, make_dataset, trials

from stoker.loader import DataLoader, WorkerOptions

KILLS = trials(4, 50)
CYCLES = trials(400, 1000)
PROCESS_CYCLES = trials(20, 50)
KW = dict(batch_size=8, shuffle=True, seed=14)
EPOCHS = 2

_TRAIN = r"""
import json, os, sys, time
from stoker.loader import DataLoader
root, ckpt, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
dl = DataLoader(root, batch_size=8, shuffle=True, seed=14, num_workers=2)
consumed = []
if os.path.exists(ckpt):
    with open(ckpt) as f:
        saved = json.load(f)
    dl.load_state_dict(saved["state"])
    consumed = saved["ids"]
while dl.epoch < epochs:
    for batch in dl:
        consumed.extend(batch["id"].tolist())
        tmp = ckpt + ".tmp"
        with open(tmp, "w") as f:  # atomically: a kill leaves the old or the new checkpoint
            json.dump({"state": dl.state_dict(), "ids": consumed}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, ckpt)
        print("step", len(consumed), flush=True)
        time.sleep(0.005)
dl.close()
print("done", flush=True)
"""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("resume") / "ds"
    make_dataset(root, [50, 60, 70, 80])
    return root


def _uninterrupted(root: Path, epochs: int = EPOCHS) -> list[int]:
    dl = DataLoader(root, **KW)
    out: list[int] = []
    while dl.epoch < epochs:
        out.extend(ids_of(dl))
    dl.close()
    return out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_killed_training_process_resumes_exactly(dataset: Path, after_trial,
                                                 tmp_path: Path) -> None:
    expected = _uninterrupted(dataset)
    total = len(expected)
    rng = random.Random(14)
    figures = Figures("14 SIGKILL the main process, resume")
    for t in range(KILLS):
        figures.start()
        ckpt = tmp_path / f"ckpt{t}.json"
        target = rng.randrange(8, total - 8)
        child = subprocess.Popen([sys.executable, "-c", _TRAIN, str(dataset), str(ckpt),
                                  str(EPOCHS)], stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        for line in child.stdout:
            if line.startswith("step") and int(line.split()[1]) >= target:
                child.send_signal(signal.SIGKILL)
                break
        child.wait(timeout=60)
        child.stdout.close()
        with Stopwatch() as sw:
            out = subprocess.run([sys.executable, "-c", _TRAIN, str(dataset), str(ckpt),
                                  str(EPOCHS)], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        final = json.loads(ckpt.read_text())["ids"]
        assert final == expected, f"trial {t}: killed near sample {target}"
        after_trial()
        figures.trial(sw.s)
    figures.write()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_ten_chained_resumes_including_the_epoch_boundary(workers: int, dataset: Path,
                                                          after_trial) -> None:
    figures = Figures(f"15 ten chained resumes (workers={workers})")
    figures.start()
    expected = _uninterrupted(dataset)
    per_epoch = len(DataLoader(dataset, **KW))
    stops = sorted({3, 7, 11, per_epoch - 1, per_epoch, per_epoch + 1, per_epoch + 5,
                    2 * per_epoch - 5, 2 * per_epoch - 3, 2 * per_epoch - 1})
    assert len(stops) == 10
    consumed: list[int] = []
    state = None
    seen = 0
    resumes = 0
    with Stopwatch() as sw:
        while True:
            dl = DataLoader(dataset, num_workers=workers, **KW)
            if state is not None:
                dl.load_state_dict(state)
                assert dl.state_dict() == state  # load-then-save gives the identical state
                resumes += 1
            broke = False
            while dl.epoch < EPOCHS and not broke:
                for batch in dl:
                    consumed.extend(ids_of([batch]))
                    seen += 1
                    if stops and seen == stops[0]:
                        stops.pop(0)
                        state = json.loads(json.dumps(dl.state_dict()))
                        broke = True
                        break
            dl.close()
            if not broke:
                break
    assert resumes == 10 and consumed == expected
    after_trial()
    figures.trial(sw.s)
    figures.write()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["thread", "process"])
def test_open_close_cycles_leak_nothing(mode: str, dataset: Path, after_trial) -> None:
    cycles = CYCLES if mode == "thread" else PROCESS_CYCLES
    me = psutil.Process()

    def cycle(k: int) -> None:
        dl = DataLoader(dataset, num_workers=2, workers=WorkerOptions(mode=mode), **KW)
        for i, batch in enumerate(dl):  # an early break, at a different place each time
            if i >= k % 5:
                break
        if k % 3 == 0:
            iter(dl)  # an iterator abandoned without a break
        dl.close()

    for k in range(5):  # warm-up: one-time imports, JIT caches, allocator pools
        cycle(k)
    gc.collect()
    threads, rss = threading.active_count(), me.memory_info().rss
    figures = Figures(f"16 open/close cycles ({mode})")
    for k in range(cycles):
        figures.start()
        with Stopwatch() as sw:
            cycle(k)
        figures.trial(sw.s)
    gc.collect()
    deadline = time.monotonic() + 5
    while threading.active_count() > threads and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= threads, [t.name for t in threading.enumerate()]
    growth = me.memory_info().rss - rss
    assert growth < 50 * 2**20, f"RSS grew {growth / 2**20:.1f} MiB over {cycles} cycles"
    after_trial()
    figures.write()
