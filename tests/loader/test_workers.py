"""Workers: errors reach the consumer with context, timeouts fire, nothing is left behind."""

from __future__ import annotations

import gc
import threading
import time

import psutil
import pytest
import torch

from stoker.loader import DataLoader, LoaderTimeoutError, WorkerError, WorkerOptions


class Squares(torch.utils.data.Dataset):
    def __init__(self, n: int, bad: int | None = None, slow: float = 0.0) -> None:
        self.n, self.bad, self.slow = n, bad, slow

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == self.bad:
            raise KeyError(f"sample {i} is broken")
        if self.slow:
            time.sleep(self.slow)
        return i * i


def _threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("stoker-worker")}


def _children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE]


def _wait_clean(before_children: int, before_threads: set[threading.Thread]) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (_threads() - before_threads
                                           or len(_children()) > before_children):
        time.sleep(0.05)
    assert not _threads() - before_threads
    assert len(_children()) <= before_children


@pytest.mark.parametrize("worker_mode", ["thread", "process"])
def test_worker_error_names_the_sample(worker_mode) -> None:
    """As torch: the dataset's own exception type (was stoker's WorkerError), with notes
    naming the sample, the batch and the worker."""
    dl = DataLoader(Squares(50, bad=17), batch_size=5, num_workers=2,
                    workers=WorkerOptions(mode=worker_mode))
    with pytest.raises(KeyError, match=r"sample 17 is broken") as info:
        list(dl)
    notes = "\n".join(info.value.__notes__)
    assert "Squares[17], sample 17 of epoch 0" in notes
    assert f"Caught KeyError in DataLoader worker {worker_mode} " in notes
    assert "while producing batch 3" in notes
    dl.close()


def test_stoker_dataset_error_names_the_shard(tmp_path) -> None:
    from loader_helpers import make_dataset

    make_dataset(tmp_path, [10, 10])
    dl = DataLoader(tmp_path, batch_size=5, num_workers=2)
    (tmp_path / "shards/00001.arrow").write_bytes(b"garbage")
    with pytest.raises(WorkerError, match=r"shard 1 .*00001\.arrow.*samples \[1"):
        list(dl)
    dl.close()


@pytest.mark.parametrize("worker_mode", ["thread", "process"])
def test_timeout_is_honoured(worker_mode) -> None:
    # the batch takes 12 s: only the timeout can end next() with an error (a loader that
    # ignored it would return the batch instead), so no clock reading is asserted. Not
    # longer: an abandoned thread worker finishes its batch holding the process-wide user-code
    # lock (stoker.loader.workers.info), which the next tests' thread workers wait for
    dl = DataLoader(Squares(8, slow=3.0), batch_size=4, num_workers=1, timeout=0.3,
                    workers=WorkerOptions(mode=worker_mode))
    with pytest.raises(LoaderTimeoutError, match="timeout=0.3") as info:
        next(iter(dl))
    assert isinstance(info.value, RuntimeError)  # what torch raises on a timeout
    dl.close()


@pytest.mark.parametrize("worker_mode", ["thread", "process"])
@pytest.mark.parametrize("ending", ["exhaust", "break", "gc"])
def test_no_worker_left_behind(worker_mode, ending) -> None:
    gc.collect()
    before, threads = len(_children()), _threads()
    dl = DataLoader(Squares(200), batch_size=4, num_workers=3,
                    workers=WorkerOptions(mode=worker_mode))
    if ending == "exhaust":
        assert len(list(dl)) == 50
    elif ending == "break":
        for i, _ in enumerate(dl):
            if i == 3:
                break
    else:
        it = iter(dl)
        next(it)
        del it, dl
        gc.collect()
    if ending != "gc":
        # an early break leaves the iterator alive until it is collected or replaced
        iter(dl).close()
        dl.close()
    _wait_clean(before, threads)


def test_persistent_workers_survive_epochs_and_keep_order() -> None:
    threads = _threads()
    dl = DataLoader(Squares(40), batch_size=4, num_workers=2, persistent_workers=True,
                    shuffle=True, seed=3)
    first = [b.tolist() for b in dl]
    pool = dl._pool
    second = [b.tolist() for b in dl]
    assert dl._pool is pool and pool is not None
    assert first != second and sorted(sum(first, [])) == sorted(sum(second, []))
    dl.close()
    _wait_clean(len(_children()), threads)


def test_worker_init_fn_runs_in_each_worker() -> None:
    seen: list[int] = []
    # thread workers: the list is shared (process workers, the default for a torch dataset,
    # append to their own copy, as in torch)
    dl = DataLoader(Squares(16), batch_size=4, num_workers=3, worker_init_fn=seen.append,
                    workers=WorkerOptions(mode="thread"))
    list(dl)
    assert sorted(seen) == [0, 1, 2]
    dl.close()


def test_transform_runs_on_whole_batches_in_workers() -> None:
    names: set[str] = set()

    def transform(batch: torch.Tensor) -> torch.Tensor:
        names.add(threading.current_thread().name)
        return batch + 1

    dl = DataLoader(Squares(12), batch_size=4, num_workers=2, transform=transform,
                    workers=WorkerOptions(mode="thread"))
    assert [b.tolist() for b in dl] == [[1, 2, 5, 10], [17, 26, 37, 50], [65, 82, 101, 122]]
    assert names and all(n.startswith("stoker-worker") for n in names)
    dl.close()


def test_pin_memory_without_cuda_warns_and_continues() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the CPU-only degradation does not apply")
    from stoker.loader.transfer import Transfer

    Transfer._warned = False
    with pytest.warns(RuntimeWarning, match="pin_memory=True is ignored"):
        dl = DataLoader(Squares(8), batch_size=4, pin_memory=True)
    assert [b.tolist() for b in dl] == [[0, 1, 4, 9], [16, 25, 36, 49]]
