"""Exact resume: samples before a stop + samples after resuming == the uninterrupted run."""

from __future__ import annotations

import json
import random

import pytest

from stoker.loader import DataLoader, ShuffleOptions, StateError

from loader_helpers import global_batches, run_with_resume

EPOCHS = 3


def _uninterrupted(dataset, **kw) -> list[int]:
    return run_with_resume(lambda _: DataLoader(dataset, **kw), [], EPOCHS)


@pytest.mark.parametrize("trial", range(10))
def test_random_stop_points_with_worker_changes(dataset, trial: int) -> None:
    """5 stops per trial x 10 trials = 50 random stop points, num_workers switching 0 <-> 4."""
    kw = dict(batch_size=24, shuffle=ShuffleOptions(partitions=4), seed=2024)
    expected = _uninterrupted(dataset, **kw)
    steps_per_epoch = len(DataLoader(dataset, **kw))
    rng = random.Random(trial)
    stops = rng.sample(range(1, EPOCHS * steps_per_epoch), 5)
    workers = [0, 4]

    def make(i: int) -> DataLoader:
        return DataLoader(dataset, num_workers=workers[(i + trial) % 2], **kw)

    assert run_with_resume(make, stops, EPOCHS) == expected


@pytest.mark.parametrize("trial", range(4))
def test_resume_across_world_sizes(dataset, trial: int) -> None:
    """Save in a W=2 run, continue with W=4 (and back): the global stream is unchanged."""
    g = 16
    reference = [i for e in range(2) for b in global_batches(dataset, 1, g, epoch=e, seed=9,
                                                             shuffle=ShuffleOptions(partitions=4)) for i in b]
    rng = random.Random(100 + trial)
    steps = len(DataLoader(dataset, batch_size=g))
    stop = rng.randrange(1, 2 * steps - 1)
    sizes = (2, 4) if trial % 2 == 0 else (4, 2)
    consumed: list[int] = []
    # phase 1: world size sizes[0] runs `stop` global steps
    loaders = [DataLoader(dataset, batch_size=g // sizes[0], seed=9, rank=r, world_size=sizes[0],
                          shuffle=ShuffleOptions(partitions=4)) for r in range(sizes[0])]
    consumed += _lockstep(loaders, stop)
    state = loaders[0].state_dict()
    for dl in loaders:
        dl.close()
    json.dumps(state)  # plain values only
    # phase 2: world size sizes[1] continues from rank 0's state
    loaders = [DataLoader(dataset, batch_size=g // sizes[1], seed=9, rank=r, world_size=sizes[1],
                          num_workers=2,
                          shuffle=ShuffleOptions(partitions=4)) for r in range(sizes[1])]
    for dl in loaders:
        dl.load_state_dict(state)
    consumed += _lockstep(loaders, 2 * steps - stop)
    for dl in loaders:
        dl.close()
    assert consumed == reference


def _lockstep(loaders: list[DataLoader], steps: int) -> list[int]:
    """Advance all ranks ``steps`` global steps (crossing epochs), merging k % W interleaved."""
    world = len(loaders)
    out: list[int] = []
    iters = [iter(dl) for dl in loaders]
    done = 0
    while done < steps:
        parts = []
        for r, dl in enumerate(loaders):
            try:
                parts.append(next(iters[r])["id"].tolist())
            except StopIteration:
                iters[r] = iter(dl)
                parts.append(next(iters[r])["id"].tolist())
        merged, k = [], 0
        while any(parts):
            merged.append(parts[k % world].pop(0))
            k += 1
        out += merged
        done += 1
    return out


def test_state_round_trip_and_chained_resumes(dataset) -> None:
    kw = dict(batch_size=50, shuffle=ShuffleOptions(partitions=4), seed=1)
    dl = DataLoader(dataset, **kw)
    it = iter(dl)
    next(it)
    state = dl.state_dict()
    dl2 = DataLoader(dataset, **kw)
    dl2.load_state_dict(state)
    assert dl2.state_dict() == state  # load-then-save is the identity


def test_state_from_another_dataset_is_refused(dataset, other_dataset) -> None:
    state = DataLoader(other_dataset, batch_size=4).state_dict()
    with pytest.raises(StateError, match="fingerprint"):
        DataLoader(dataset, batch_size=4).load_state_dict(state)


@pytest.mark.parametrize(("change", "match"), [
    ({"batch_size": 8}, "global batch"),
    ({"shuffle": False}, "order options"),
    ({"shuffle": ShuffleOptions(partitions=8)}, "order options"),
    ({"drop_last": True}, "drop_last"),
])
def test_incompatible_options_are_refused(dataset, change, match) -> None:
    kw = dict(batch_size=4, shuffle=ShuffleOptions(partitions=4), seed=0)
    state = DataLoader(dataset, **kw).state_dict()
    with pytest.raises(StateError, match=match):
        DataLoader(dataset, **{**kw, **change}).load_state_dict(state)


def test_garbage_state_is_refused(dataset) -> None:
    with pytest.raises(StateError):
        DataLoader(dataset).load_state_dict({"epoch": 3})


def test_state_saved_after_the_last_batch_is_the_next_epoch(dataset) -> None:
    kw = dict(batch_size=100, shuffle=True, seed=5)
    dl = DataLoader(dataset, **kw)
    it = iter(dl)
    for _ in range(len(dl)):
        next(it)
    state = dl.state_dict()
    assert (state["epoch"], state["step"]) == (1, 0)
    resumed = DataLoader(dataset, **kw)
    resumed.load_state_dict({**state, "epoch": 0, "step": len(dl)})  # the same position
    assert resumed.epoch == 1 and resumed.state_dict() == state
    dl.set_epoch(1)
    assert [b["id"].tolist() for b in resumed] == [b["id"].tolist() for b in dl]
