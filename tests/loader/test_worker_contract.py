"""torch's worker contract in every worker mode (issue 18): get_worker_info(), each process
worker's own dataset copy and one intra-op thread, the sharding worker_init_fn, a dead
worker named by pid and signal, in_order=False."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from torch.utils.data import get_worker_info

from stoker.loader import DataLoader, WorkerOptions
from stoker.loader.ledger.reader import read_ledger


class Probe(torch.utils.data.Dataset):
    """Returns what a sample sees of its worker."""

    tag = "main"

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> dict:
        info = get_worker_info()
        if info is None:
            return {"i": i, "id": -1, "n": 0, "seed": -1, "tag": self.tag, "threads": -1,
                    "own": True}
        return {"i": i, "id": info.id, "n": info.num_workers, "seed": info.seed,
                "tag": info.dataset.tag, "threads": torch.get_num_threads(),
                "own": info.dataset is self and type(info).__name__ == "WorkerInfo"}


def _tag_worker(worker_id: int) -> None:
    """The common worker_init_fn: configure this worker's copy of the dataset."""
    get_worker_info().dataset.tag = f"worker{worker_id}"


def _rows(loader) -> list[dict]:
    rows = [dict(zip(b, vals)) for b in loader for vals in zip(*(v.tolist() if
            isinstance(v, torch.Tensor) else v for v in b.values()))]
    loader.close()
    return rows


def test_main_process_has_no_worker_info() -> None:
    rows = _rows(DataLoader(Probe(), batch_size=6))
    assert {r["id"] for r in rows} == {-1} and len(rows) == 24


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_every_worker_mode_gives_torch_worker_info(mode: str) -> None:
    rows = _rows(DataLoader(Probe(), batch_size=6, num_workers=2, seed=11,
                            worker_init_fn=_tag_worker if mode == "process" else None,
                            workers=WorkerOptions(mode=mode)))
    assert sorted(r["i"] for r in rows) == list(range(24))
    assert {r["id"] for r in rows} <= {0, 1} and {r["n"] for r in rows} == {2}
    assert all(r["own"] for r in rows)
    bases = {r["seed"] - r["id"] for r in rows}
    assert len(bases) == 1  # seed = base_seed + id, as torch
    again = _rows(DataLoader(Probe(), batch_size=6, num_workers=2, seed=11,
                             workers=WorkerOptions(mode=mode)))
    assert {r["seed"] - r["id"] for r in again} == bases  # derived from the loader's seed
    other = _rows(DataLoader(Probe(), batch_size=6, num_workers=2, seed=12,
                             workers=WorkerOptions(mode=mode)))
    assert {r["seed"] - r["id"] for r in other} != bases
    if mode == "process":
        # each worker configured its own copy; one intra-op thread per worker, as torch
        assert all(r["tag"] == f"worker{r['id']}" for r in rows)
        assert {r["threads"] for r in rows} == {1}
        assert Probe.tag == "main" and "tag" not in vars(Probe())


def test_thread_worker_init_fn_sees_its_worker() -> None:
    seen: list[tuple[int, int]] = []

    def init(worker_id: int) -> None:
        info = get_worker_info()
        seen.append((worker_id, info.id))

    _rows(DataLoader(Probe(), batch_size=6, num_workers=3, worker_init_fn=init,
                     workers=WorkerOptions(mode="thread")))
    assert sorted(seen) == [(0, 0), (1, 1), (2, 2)]
    assert get_worker_info() is None  # not left behind in the main thread


class KillsItsWorker(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        if i == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        return i


def test_dead_worker_is_a_runtime_error_naming_pid_and_signal() -> None:
    dl = DataLoader(KillsItsWorker(), batch_size=2, num_workers=2,
                    workers=WorkerOptions(mode="process"))
    with pytest.raises(RuntimeError, match=r"worker process \d \(pid \d+\) was killed by "
                                           r"signal 9 \(SIGKILL\) producing batch 2") as info:
        list(dl)
    assert type(info.value).__name__ == "WorkerError"
    dl.close()


class SlowFirst(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> int:
        if i == 0:
            time.sleep(1.0)  # batch 0 is still running when every other batch is done
        return i


def test_in_order_false_yields_batches_as_they_are_ready(tmp_path) -> None:
    """As torch's in_order=False; the ledger says the order contract is off, and a state
    saved mid-epoch resumes without repeating or skipping a batch."""
    ledger = tmp_path / "run.ledger"
    dl = DataLoader(SlowFirst(), batch_size=2, num_workers=2, in_order=False, ledger=ledger,
                    workers=WorkerOptions(mode="process"))
    it = iter(dl)
    head = [next(it).tolist() for _ in range(3)]
    assert [0, 1] not in head  # batch 0 (sample 0 sleeps) was overtaken
    state = dl.state_dict()
    assert state["step"] == 0 and len(state["ahead"]) == 3
    dl.close()
    assert read_ledger(ledger).header["in_order"] is False
    again = DataLoader(SlowFirst(), batch_size=2, in_order=False)
    again.load_state_dict(state)
    tail = [b.tolist() for b in again]
    assert sorted(head + tail) == [[2 * k, 2 * k + 1] for k in range(8)]
    ordered = DataLoader(SlowFirst(), batch_size=2, num_workers=2,
                         workers=WorkerOptions(mode="process"))
    assert [b.tolist() for b in ordered][0] == [0, 1]  # in_order=True (default) keeps order
    ordered.close()


_CONV_AFTER_PARENT = """
import torch
from stoker.loader import DataLoader, WorkerOptions

class Conv(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.nn.functional.conv2d(torch.randn(1, 8, 64, 64), torch.randn(8, 8, 3, 3)).sum()

torch.set_num_threads(2)  # the parent's intra-op pool is running before the workers fork
torch.nn.functional.conv2d(torch.randn(4, 8, 128, 128), torch.randn(8, 8, 3, 3))
print(len(list(DataLoader(Conv(), batch_size=2, num_workers=2,
                          workers=WorkerOptions(mode="process")))))
"""


def test_forked_workers_run_torch_ops_after_the_parent_did() -> None:
    """Issue 18 item 6: without torch.set_num_threads(1) in the worker this hung (a forked
    copy of the parent's intra-op thread pool); run in a child so a hang is a clean failure."""
    done = subprocess.run([sys.executable, "-c", _CONV_AFTER_PARENT], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "4", done.stderr[-2000:]
