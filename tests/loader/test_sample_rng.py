"""Augmentations in user datasets are reproducible (issue 18): every dataset call runs with
torch, numpy and random seeded from (seed, epoch, sample), so the values a sample gets do not
depend on the run, num_workers, the worker mode, the world size or a mid-epoch resume."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from stoker.loader import DataLoader, WorkerOptions

N, BATCH = 40, 4


class Augmented(torch.utils.data.Dataset):
    """Each sample draws from all three global generators, as augmentations do."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i), torch.rand(()).item(), np.random.rand(),
                             random.random()], dtype=torch.float64)


class AugmentedBatches(Augmented):
    def __getitems__(self, ids: list[int]) -> list[torch.Tensor]:
        noise = torch.rand(len(ids))
        return [torch.tensor([float(i), float(v), 0.0, 0.0], dtype=torch.float64)
                for i, v in zip(ids, noise)]


def values(batches) -> dict[int, tuple[float, ...]]:
    """sample id -> the values it drew, over all batches (the key is the id column)."""
    out = {}
    for b in batches:
        for row in b.tolist():
            assert int(row[0]) not in out
            out[int(row[0])] = tuple(row[1:])
    return out


def run(dataset=None, *, draw_between: bool = False, **kw) -> dict[int, tuple[float, ...]]:
    loader = DataLoader(dataset or Augmented(), batch_size=BATCH, **kw)
    got = []
    for b in loader:
        got.append(b)
        if draw_between:  # the training loop uses the global generators too
            torch.rand(3), np.random.rand(), random.random()
    loader.close()
    return values(got)


CONFIGS = [(0, "thread"), (1, "thread"), (2, "thread"), (4, "thread"),
           (1, "process"), (2, "process"), (4, "process")]


@pytest.fixture(scope="module")
def reference() -> dict[int, tuple[float, ...]]:
    ref = run(seed=7, shuffle=True)
    assert len(ref) == N and len(set(ref.values())) == N  # every sample drew its own values
    return ref


@pytest.mark.parametrize(("num_workers", "mode"), CONFIGS)
def test_same_values_on_every_run_whatever_the_workers(reference, num_workers, mode) -> None:
    for _ in range(3):
        assert run(seed=7, shuffle=True, num_workers=num_workers, workers=WorkerOptions(mode=mode)) == reference


def test_consumer_draws_do_not_change_the_values(reference) -> None:
    assert run(seed=7, shuffle=True, draw_between=True) == reference
    assert run(seed=7, shuffle=True, num_workers=2, workers=WorkerOptions(mode="process"),
               draw_between=True) == reference


def test_world_size_does_not_change_the_values(reference) -> None:
    ranks = [run(seed=7, shuffle=True, rank=r, world_size=2, num_workers=2) for r in range(2)]
    assert not set(ranks[0]) & set(ranks[1])
    assert {**ranks[0], **ranks[1]} == reference


@pytest.mark.parametrize(("num_workers", "mode"), [(0, "thread"), (2, "process")])
def test_mid_epoch_resume_does_not_change_the_values(reference, num_workers, mode) -> None:
    first = DataLoader(Augmented(), batch_size=BATCH, seed=7, shuffle=True)
    it = iter(first)
    head = [next(it) for _ in range(4)]
    state = first.state_dict()
    first.close()
    second = DataLoader(Augmented(), batch_size=BATCH, seed=7, shuffle=True,
                        num_workers=num_workers,
                        workers=WorkerOptions(mode=mode))
    second.load_state_dict(state)
    tail = list(second)
    second.close()
    assert values(head + tail) == reference


def test_seed_from_torch_manual_seed_is_reproducible() -> None:
    """The issue's user: torch.manual_seed(0), no seed=; 2 workers, threads and processes."""
    runs = []
    for mode in ("thread", "process", "thread"):
        torch.manual_seed(0), np.random.seed(0), random.seed(0)
        runs.append(run(num_workers=2, workers=WorkerOptions(mode=mode)))
    assert runs[0] == runs[1] == runs[2]


def test_the_values_depend_on_seed_and_epoch(reference) -> None:
    """One changed input changes every sample's values (so the tests above can fail)."""
    other = run(seed=8, shuffle=True)
    assert all(other[i] != reference[i] for i in range(N))
    loader = DataLoader(Augmented(), batch_size=BATCH, seed=7, shuffle=True)
    loader.set_epoch(1)
    epoch1 = values(loader)
    assert all(epoch1[i] != reference[i] for i in range(N))


def test_getitems_calls_are_seeded_by_their_ids() -> None:
    ref = run(AugmentedBatches(), seed=3)
    for num_workers, mode in [(2, "thread"), (2, "process")]:
        assert run(AugmentedBatches(), seed=3, num_workers=num_workers,
                   workers=WorkerOptions(mode=mode)) == ref


def test_opting_out_gives_torch_values() -> None:
    """sample_seeding=False: the shared global stream, as torch's num_workers=0."""
    torch.manual_seed(5)
    theirs = values(torch.utils.data.DataLoader(Augmented(), batch_size=BATCH))
    torch.manual_seed(5)
    assert [v[0] for v in run(workers=WorkerOptions(sample_seeding=False)).values()] == \
        [v[0] for v in theirs.values()]
