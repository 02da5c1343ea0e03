"""stoker vs torch.utils.data.DataLoader on a table of datasets and arguments (issue 18).

For every row, both loaders are built with the same dataset and arguments, and they must
produce the same batches, raise the same exception types and issue the same warnings:
workers 0 and 2, each stoker worker mode, shuffle off or a given sampler (``shuffle=True``'s
order is stoker's own, see README "Differences from torch.utils.data.DataLoader").
"""

from __future__ import annotations

import multiprocessing
import os
import time
import warnings
from typing import Any, Callable

import pytest
import torch
from torch.utils.data import BatchSampler, Dataset, IterableDataset, SequentialSampler
from torch.utils.data import SubsetRandomSampler
from torch_compare import assert_same

from stoker.loader import DataLoader, WorkerOptions


class Pairs(Dataset):
    def __len__(self) -> int:
        return 29

    def __getitem__(self, i: Any) -> dict:
        if isinstance(i, list):  # a sampler handing whole index lists (batch_size=None)
            return {"x": torch.tensor(i, dtype=torch.float64), "n": len(i)}
        return {"x": torch.tensor([i, -i], dtype=torch.float32), "y": i % 5, "name": f"n{i}",
                "t": (i, float(i) / 3)}


class Batched(Pairs):
    def __getitems__(self, ids: list[int]) -> list[dict]:
        return [{"x": torch.tensor([i, -i], dtype=torch.float32), "b": len(ids)} for i in ids]


class Failing(Pairs):
    def __getitem__(self, i: Any) -> dict:
        if i == 11:
            raise KeyError(f"no sample {i}")
        if i == 23:
            raise ZeroDivisionError("custom failure")
        return super().__getitem__(i)


class Slow(Pairs):
    def __getitem__(self, i: Any) -> dict:
        if i == 4:
            time.sleep(1.0)
        return super().__getitem__(i)


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(5))


def _sum_collate(samples: list) -> torch.Tensor:
    return torch.stack([s["x"] for s in samples]).sum(dim=1) + 0.5


def _bad_init(worker_id: int) -> None:
    raise ValueError(f"worker_init_fn failed in worker {worker_id}")


def _sampler() -> SubsetRandomSampler:
    return SubsetRandomSampler(list(range(0, 29, 3)), generator=torch.Generator().manual_seed(0))


ROWS: dict[str, tuple[Callable[[], Dataset], Callable[[], dict]]] = {
    "batch1": (Pairs, lambda: {}),
    "batch6": (Pairs, lambda: dict(batch_size=6)),
    "batch6_drop_last": (Pairs, lambda: dict(batch_size=6, drop_last=True)),
    "shuffle_false": (Pairs, lambda: dict(batch_size=4, shuffle=False)),
    "no_batching": (Pairs, lambda: dict(batch_size=None)),
    "collate_fn": (Pairs, lambda: dict(batch_size=5, collate_fn=_sum_collate)),
    "getitems": (Batched, lambda: dict(batch_size=4)),
    "random_sampler": (Pairs, lambda: dict(batch_size=4, sampler=_sampler())),
    "list_sampler": (Pairs, lambda: dict(batch_size=3, sampler=[5, 3, 28, 0, 7])),
    "sequential_sampler": (Pairs, lambda: dict(batch_size=5, sampler=SequentialSampler(range(29)))),
    "batch_sampler": (Pairs, lambda: dict(batch_sampler=BatchSampler(SequentialSampler(range(29)),
                                                                      8, False))),
    "batch_sampler_list": (Pairs, lambda: dict(batch_sampler=[[3, 1], [4, 1, 5], [9]])),
    "index_list_sampler": (Pairs, lambda: dict(
        batch_size=None, sampler=BatchSampler(SequentialSampler(range(29)), 7, False))),
    "index_list_sampler_getitems": (Batched, lambda: dict(batch_size=None,
                                                          sampler=[[1, 2], [28], [4, 4, 4]])),
}
WORKERS = [(0, None), (2, "thread"), (2, "process")]


def _outcome(loader: Any) -> tuple[str, Any]:
    it = iter(loader)
    try:
        return "batches", list(it)
    except Exception as exc:  # noqa: BLE001 - the type is what is compared
        return "error", exc
    finally:
        # torch's iterator stops its workers when collected, which can take 10 s after an
        # error; stop them now
        getattr(it, "_shutdown_workers", lambda: None)()
        if isinstance(loader, DataLoader):
            loader.close()


@pytest.mark.parametrize(("num_workers", "mode"), WORKERS)
@pytest.mark.parametrize("row", sorted(ROWS))
def test_same_batches(row: str, num_workers: int, mode: str | None) -> None:
    make, kw = ROWS[row]
    theirs = list(torch.utils.data.DataLoader(make(), num_workers=num_workers, **kw()))
    ours_loader = DataLoader(make(), num_workers=num_workers, workers=WorkerOptions(mode=mode),
                             **kw())
    assert len(ours_loader) == len(theirs)
    assert_same(theirs, list(ours_loader))
    ours_loader.close()


ERRORS = {
    "key_error": (Failing, dict(batch_size=4)),
    "custom_error_late": (Failing, dict(batch_size=4, sampler=[23, 0])),
    "no_batching_error": (Failing, dict(batch_size=None, sampler=[3, 11])),
    "worker_init_fn": (Pairs, dict(batch_size=4, worker_init_fn=_bad_init)),
}


@pytest.mark.parametrize(("num_workers", "mode"), WORKERS)
@pytest.mark.parametrize("row", sorted(ERRORS))
def test_same_exception_types(row: str, num_workers: int, mode: str | None) -> None:
    make, kw = ERRORS[row]
    kind, theirs = _outcome(torch.utils.data.DataLoader(make(), num_workers=num_workers, **kw))
    ours_kind, ours = _outcome(DataLoader(make(), num_workers=num_workers,
                                          workers=WorkerOptions(mode=mode),
                                          **kw))
    assert (ours_kind, type(ours)) == (kind, type(theirs)), (ours, theirs)


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_timeout_is_a_runtime_error_as_in_torch(mode: str) -> None:
    kw = dict(batch_size=2, sampler=[4, 5], num_workers=1, timeout=0.2)
    kind, theirs = _outcome(torch.utils.data.DataLoader(Slow(), **kw))
    ours_kind, ours = _outcome(DataLoader(Slow(), workers=WorkerOptions(mode=mode), **kw))
    assert kind == ours_kind == "error" and type(theirs) is RuntimeError
    assert isinstance(ours, RuntimeError) and isinstance(ours, TimeoutError)


INVALID = {
    "num_workers": dict(num_workers=-1),
    "timeout": dict(timeout=-1),
    "prefetch_without_workers": dict(prefetch_factor=2),
    "prefetch_negative": dict(num_workers=2, prefetch_factor=-1),
    "persistent_without_workers": dict(persistent_workers=True),
    "sampler_and_shuffle": dict(sampler=[0, 1], shuffle=True),
    "batch_sampler_and_batch_size": dict(batch_sampler=[[0]], batch_size=3),
    "batch_sampler_and_drop_last": dict(batch_sampler=[[0]], drop_last=True),
    "batch_sampler_and_shuffle": dict(batch_sampler=[[0]], shuffle=True),
    "no_batching_and_drop_last": dict(batch_size=None, drop_last=True),
    "batch_size_zero": dict(batch_size=0),
    "bad_start_method": dict(num_workers=2, multiprocessing_context="no-such-method"),
    "context_not_a_context": dict(num_workers=2, multiprocessing_context=object()),
    "context_without_workers": dict(multiprocessing_context="spawn"),
    "iterable_with_shuffle": dict(dataset=Stream(), shuffle=True),
    "iterable_with_sampler": dict(dataset=Stream(), sampler=[0]),
    "iterable_with_batch_sampler": dict(dataset=Stream(), batch_sampler=[[0]]),
}


@pytest.mark.parametrize("row", sorted(INVALID))
def test_same_argument_errors(row: str) -> None:
    kw = dict(INVALID[row])
    dataset = kw.pop("dataset", Pairs())

    def build(cls: Any) -> BaseException:
        with pytest.raises(Exception) as info:  # noqa: PT011 - the type is compared below
            loader = cls(dataset, **kw)
            list(loader)  # torch checks batch_size when its BatchSampler is built or used
        return info.value

    theirs, ours = build(torch.utils.data.DataLoader), build(DataLoader)
    assert type(ours) is type(theirs), (ours, theirs)
    assert str(ours).split(";")[0][:40] == str(theirs).split(";")[0][:40]


@pytest.mark.parametrize("attr", ["batch_size", "sampler", "batch_sampler", "drop_last",
                                  "dataset", "persistent_workers"])
def test_reassigning_after_init_is_refused(attr: str) -> None:
    for cls in (torch.utils.data.DataLoader, DataLoader):
        loader = cls(Pairs(), batch_size=2)
        with pytest.raises(ValueError, match=f"{attr} attribute should not be set after "
                                             "DataLoader is initialized"):
            setattr(loader, attr, getattr(loader, attr))
    loader.worker_init_fn = None  # what torch leaves settable stays settable


def _warnings(cls: Any, **kw: Any) -> list[tuple[type, str]]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        loader = cls(Pairs(), **kw)
    if hasattr(loader, "close"):
        loader.close()
    return [(w.category, str(w.message)) for w in seen]


def test_same_warnings() -> None:
    many = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1) + 1
    for kw in (dict(num_workers=many), dict(num_workers=1), dict(batch_size=3)):
        theirs = _warnings(torch.utils.data.DataLoader, **kw)
        assert _warnings(DataLoader, **kw) == theirs, kw
    assert theirs == [] and _warnings(DataLoader, num_workers=many)  # the table can fail


def test_multiprocessing_context_as_object_or_name() -> None:
    data = torch.utils.data.TensorDataset(torch.arange(29))  # importable in a spawned worker
    for context in ("fork", multiprocessing.get_context("spawn")):
        loader = DataLoader(data, batch_size=10, num_workers=1, multiprocessing_context=context,
                            workers=WorkerOptions(mode="process"))
        assert isinstance(loader.multiprocessing_context, multiprocessing.context.BaseContext)
        assert_same(list(torch.utils.data.DataLoader(data, batch_size=10)), list(loader))
        loader.close()


def test_recognised_as_a_torch_dataloader() -> None:
    loader = DataLoader(Pairs(), batch_size=3)
    assert isinstance(loader, torch.utils.data.DataLoader)
    assert DataLoader[int] is not None and DataLoader[dict].__origin__ is DataLoader
    loader.close()
