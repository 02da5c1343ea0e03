"""Same scenarios through torch's DataLoader and stoker's: identical batches."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import BatchSampler, SequentialSampler, SubsetRandomSampler

from stoker.loader import DataLoader
from torch_compare import assert_same


class Pairs(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 53

    def __getitem__(self, i: int) -> dict:
        return {"x": torch.tensor([i, -i], dtype=torch.float32), "y": i % 5, "name": f"n{i}"}


def _collate(samples: list) -> torch.Tensor:
    return torch.stack([s["x"] for s in samples]).sum(dim=1) + 0.5


SCENARIOS = {
    "batch7": dict(batch_size=7),
    "batch7_drop_last": dict(batch_size=7, drop_last=True),
    "batch1": dict(),
    "no_batching": dict(batch_size=None),
    "collate_fn": dict(batch_size=6, collate_fn=_collate),
    "sampler": dict(batch_size=4, sampler=SubsetRandomSampler(
        list(range(0, 53, 3)), generator=torch.Generator().manual_seed(0))),
    "sequential_sampler": dict(batch_size=5, sampler=SequentialSampler(range(53))),
    "batch_sampler": dict(batch_sampler=BatchSampler(SequentialSampler(range(53)), 9, False)),
    "batch_sampler_list": dict(batch_sampler=[[3, 1], [4, 1, 5], [9]]),
}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_identical_batches(name: str, num_workers: int) -> None:
    kw = SCENARIOS[name]
    sampler = kw.get("sampler")
    if sampler is not None and hasattr(sampler, "generator"):
        sampler.generator.manual_seed(0)
    theirs = list(torch.utils.data.DataLoader(Pairs(), num_workers=num_workers, **kw))
    if sampler is not None and hasattr(sampler, "generator"):
        sampler.generator.manual_seed(0)
    ours_loader = DataLoader(Pairs(), num_workers=num_workers, **kw)
    ours = list(ours_loader)
    assert len(ours) == len(theirs) == len(ours_loader)
    assert_same(theirs, ours)
    ours_loader.close()


@pytest.mark.parametrize("kw", [
    dict(num_workers=-1), dict(timeout=-1), dict(prefetch_factor=2),
    dict(persistent_workers=True), dict(sampler=[0, 1], shuffle=True),
    dict(batch_sampler=[[0]], batch_size=3), dict(batch_size=None, drop_last=True),
])
def test_same_argument_errors_as_torch(kw) -> None:
    with pytest.raises(ValueError) as theirs:
        torch.utils.data.DataLoader(Pairs(), **kw)
    with pytest.raises(ValueError) as ours:
        DataLoader(Pairs(), **kw)
    assert str(ours.value).split(";")[0][:30] == str(theirs.value).split(";")[0][:30]
