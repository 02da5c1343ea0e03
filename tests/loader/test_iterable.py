"""IterableDataset with torch's semantics (issue 18): same batches as torch for every
worker count and mode, get_worker_info() sharding, uneven workers, errors with their own
type, a ledger marked "order not guaranteed", and Stateful resume."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import IterableDataset, get_worker_info
from torch_compare import assert_same

from stoker.loader import DataLoader, StateError, WorkerOptions
from stoker.loader.ledger.reader import read_ledger


class Shards(IterableDataset):
    """Worker w of k yields the items i with i % k == w: uneven shares when k does not
    divide n, so workers run out at different times."""

    def __init__(self, n: int = 23, fail_at: int | None = None) -> None:
        self.n, self.fail_at = n, fail_at

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        info = get_worker_info()
        w, k = (info.id, info.num_workers) if info else (0, 1)
        for i in range(w, self.n, k):
            if i == self.fail_at:
                raise LookupError(f"item {i} is missing")
            yield {"i": i, "x": torch.tensor([i, 2 * i])}


class Resumable(Shards):
    """Stateful (torchdata's protocol): remembers how far this copy has iterated."""

    def __init__(self, n: int = 23) -> None:
        super().__init__(n)
        self.done = 0

    def __iter__(self):
        info = get_worker_info()
        w, k = (info.id, info.num_workers) if info else (0, 1)
        mine = list(range(w, self.n, k))
        while self.done < len(mine):
            i = mine[self.done]
            self.done += 1
            yield {"i": i, "x": torch.tensor([i, 2 * i])}

    def state_dict(self) -> dict:
        return {"done": self.done}

    def load_state_dict(self, state: dict) -> None:
        self.done = state["done"]


ARGS = [dict(batch_size=4), dict(batch_size=4, drop_last=True), dict(batch_size=None),
        dict(batch_size=5, collate_fn=lambda items: [d["i"] for d in items])]
WORKERS = [(0, None), (2, "thread"), (3, "process"), (2, "process")]


@pytest.mark.parametrize(("num_workers", "mode"), WORKERS)
@pytest.mark.parametrize("kw", ARGS, ids=["batch4", "drop_last", "no_batching", "collate_fn"])
def test_same_batches_as_torch(kw, num_workers, mode) -> None:
    theirs = list(torch.utils.data.DataLoader(Shards(), num_workers=num_workers, **kw))
    loader = DataLoader(Shards(), num_workers=num_workers, workers=WorkerOptions(mode=mode), **kw)
    assert len(loader) == len(torch.utils.data.DataLoader(Shards(), **kw))
    assert_same(theirs, list(loader))
    loader.close()


@pytest.mark.parametrize(("num_workers", "mode"), WORKERS)
def test_error_keeps_its_type(num_workers, mode) -> None:
    loader = DataLoader(Shards(fail_at=9), batch_size=4, num_workers=num_workers,
                        workers=WorkerOptions(mode=mode))
    with pytest.raises(LookupError, match="item 9 is missing"):
        list(loader)
    loader.close()


def test_ledger_marks_the_run_and_records_content(tmp_path) -> None:
    ledger = tmp_path / "it.ledger"
    loader = DataLoader(Shards(), batch_size=4, num_workers=2, ledger=ledger)
    batches = list(loader)
    loader.close()
    segment = read_ledger(ledger).segments[0]
    assert segment.header["iterable"] == "order not guaranteed"
    assert segment.header["mode"] == "iterable"
    assert len(segment.steps) == len(batches) == 6  # 12 + 11 items, 3 batches per worker
    assert segment.content.shape == (6, 1) and len(set(segment.content[:, 0].tolist())) == 6


@pytest.mark.parametrize(("num_workers", "mode"), [(0, None), (2, "process")])
def test_stateful_dataset_resumes_mid_epoch(num_workers, mode) -> None:
    kw = dict(batch_size=3, num_workers=num_workers, workers=WorkerOptions(mode=mode))
    whole = [b["i"].tolist() for b in DataLoader(Resumable(), **kw)]
    first = DataLoader(Resumable(), **kw)
    it = iter(first)
    head = [next(it)["i"].tolist() for _ in range(3)]
    state = first.state_dict()
    first.close()
    second = DataLoader(Resumable(), **kw)
    second.load_state_dict(state)
    tail = [b["i"].tolist() for b in second]
    second.close()
    assert head + tail == whole and len(whole) == 8


def test_without_state_dict_the_state_says_why() -> None:
    loader = DataLoader(Shards(), batch_size=3)
    next(iter(loader))
    state = loader.state_dict()
    assert state["resumable"] is False and "Stateful" in state["reason"]
    with pytest.raises(StateError, match="does not implement state_dict"):
        DataLoader(Shards(), batch_size=3).load_state_dict(state)
    resumable = DataLoader(Resumable(), batch_size=3, num_workers=2,
                           workers=WorkerOptions(mode="process"))
    with pytest.raises(StateError, match="num_workers=0 and this loader has 2"):
        resumable.load_state_dict(DataLoader(Resumable(), batch_size=3).state_dict())
