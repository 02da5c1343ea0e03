"""The global batch sequence does not depend on workers, worker mode or world size."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stoker.loader import DataLoader, ShuffleOptions, WorkerOptions
from stoker.loader.order.epoch import EpochOrder

from loader_helpers import global_batches, ids_of

G = 32


@pytest.fixture(scope="module")
def reference(dataset):
    return {e: global_batches(dataset, 1, G, epoch=e, shuffle=ShuffleOptions(partitions=4),
                              seed=11)
            for e in (0, 1)}


@pytest.mark.parametrize(("worker_mode", "num_workers"),
                         [("thread", 0), ("thread", 1), ("thread", 2), ("thread", 4),
                          ("process", 1), ("process", 2), ("process", 4)])
def test_workers_do_not_change_order(dataset, reference, num_workers, worker_mode) -> None:
    for epoch in (0, 1):
        got = global_batches(dataset, 1, G, epoch=epoch, seed=11,
                             shuffle=ShuffleOptions(partitions=4), num_workers=num_workers,
                             workers=WorkerOptions(mode=worker_mode))
        assert got == reference[epoch]


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_world_size_does_not_change_global_batches(dataset, reference, world_size,
                                                   num_workers) -> None:
    got = global_batches(dataset, world_size, G, epoch=1, shuffle=ShuffleOptions(partitions=4),
                         seed=11,
                         num_workers=num_workers)
    assert got == reference[1]


def test_epoch_is_a_permutation_and_epochs_differ(dataset, reference) -> None:
    flat0 = [i for b in reference[0] for i in b]
    flat1 = [i for b in reference[1] for i in b]
    assert sorted(flat0) == list(range(len(flat0))) == sorted(flat1)
    assert flat0 != flat1


@pytest.mark.parametrize("world_size", [2, 4])
def test_rank_opens_only_its_partitions_shards(dataset, world_size) -> None:
    for rank in range(world_size):
        dl = DataLoader(dataset, batch_size=8, seed=5, rank=rank, world_size=world_size,
                        shuffle=ShuffleOptions(partitions=4))
        ids_of(dl)
        order = EpochOrder(dl._source.shard_rows, dl._source.fingerprint, dl.seed, 0,
                           dl.order_options)
        expected = set(order.shard_sequence(0, order.num_samples, rank, world_size).tolist())
        opened = dl._source.opened_shards
        assert opened == expected
        assert len(opened) < len(dl._source.shard_rows)
        dl.close()


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_take_equal_step_counts(dataset, drop_last) -> None:
    n = int(np.sum(DataLoader(dataset)._source.shard_rows))
    counts = []
    for rank in range(4):
        dl = DataLoader(dataset, batch_size=9, seed=1, rank=rank, world_size=4,
                        drop_last=drop_last,
                        shuffle=ShuffleOptions(partitions=4))
        batches = ids_of(dl)
        counts.append((len(batches), len(dl)))
        assert all(len(b) == 9 for b in batches[:-1])
    assert len(set(counts)) == 1
    steps = counts[0][0]
    assert steps == (n // 36 if drop_last else -(-n // 36))


def test_shuffle_false_is_natural_order(dataset) -> None:
    flat = [i for b in ids_of(DataLoader(dataset, batch_size=10)) for i in b]
    assert flat == list(range(len(flat)))


def test_seed_from_torch_global_rng_is_recorded(dataset) -> None:
    import torch

    torch.manual_seed(123)
    a = DataLoader(dataset, batch_size=10, shuffle=True)
    torch.manual_seed(123)
    b = DataLoader(dataset, batch_size=10, shuffle=True)
    assert a.seed == b.seed == a.state_dict()["seed"]
    assert ids_of(a) == ids_of(b)
    g = torch.Generator().manual_seed(7)
    c = DataLoader(dataset, batch_size=10, shuffle=True, generator=g)
    assert c.seed == torch.empty((), dtype=torch.int64).random_(
        generator=torch.Generator().manual_seed(7)).item()


def test_tail_shares_of_a_generic_dataset_keep_ranks_in_step() -> None:
    """10 samples, global batch 9, W=3: the last step has one sample, so two ranks get an
    empty batch with the right structure, and the union over ranks is every sample once."""
    data = [(i, float(i)) for i in range(10)]
    seen, steps = [], set()
    for rank in range(3):
        batches = list(DataLoader(data, batch_size=3, rank=rank, world_size=3, shuffle=True,
                                  seed=4))
        steps.add(len(batches))
        for ids, vals in batches:
            assert ids.dtype == torch.int64 and vals.dtype == torch.float64
            seen += ids.tolist()
    assert steps == {2}
    assert sorted(seen) == list(range(10))
