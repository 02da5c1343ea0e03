"""Rank and world size are resolved when iteration starts (issue 18): torch.distributed's
process group, else RANK or LOCAL_RANK + NODE_RANK * LOCAL_WORLD_SIZE, and WORLD_SIZE; a
loader that disagrees with the process group refuses instead of letting ranks diverge."""

from __future__ import annotations

import contextlib
import socket

import pytest
import torch
import torch.distributed as dist

from stoker.loader import DataLoader
from stoker.loader.distributed import WorldError, env_world

ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE")


class Ids(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> int:
        return i


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(("values", "expected"), [
    ({}, (0, 1)),
    ({"RANK": "3", "WORLD_SIZE": "4"}, (3, 4)),
    ({"LOCAL_RANK": "1", "WORLD_SIZE": "2"}, (1, 2)),  # Lightning's second process: no RANK
    ({"LOCAL_RANK": "1", "NODE_RANK": "1", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "4"}, (3, 4)),
    ({"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "4"}, (2, 4)),  # RANK wins
])
def test_environment_rules(env, values, expected) -> None:
    for name, value in values.items():
        env.setenv(name, value)
    assert env_world() == expected


def test_node_rank_without_local_world_size_is_refused(env) -> None:
    env.setenv("NODE_RANK", "1")
    env.setenv("LOCAL_RANK", "0")
    with pytest.raises(WorldError, match="set RANK"):
        env_world()


def test_world_is_resolved_when_iteration_starts(env) -> None:
    """Built before the launcher's environment (or process group) exists, as Lightning's
    launching process does: the loader reads rank 1 of 2 once that is what the process is."""
    loader = DataLoader(Ids(), batch_size=4, seed=1, shuffle=True)
    assert (loader.rank, loader.world_size, len(loader)) == (0, 1, 10)
    env.setenv("WORLD_SIZE", "2")
    env.setenv("LOCAL_RANK", "1")
    got = [i for b in loader for i in b.tolist()]
    assert (loader.rank, loader.world_size, len(loader)) == (1, 2, 5)
    rank0 = DataLoader(Ids(), batch_size=4, seed=1, shuffle=True, rank=0, world_size=2)
    other = [i for b in rank0 for i in b.tolist()]
    assert sorted(got + other) == list(range(40)) and len(got) == len(other) == 20


@contextlib.contextmanager
def one_process_group():
    """A one-process gloo process group on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def group():
    with one_process_group():
        yield


def test_process_group_wins_over_environment(env, group) -> None:
    env.setenv("WORLD_SIZE", "2")  # a stale environment; the group says 0 of 1
    loader = DataLoader(Ids(), batch_size=4)
    assert (loader.rank, loader.world_size, len(loader)) == (0, 1, 10)


def test_disagreeing_with_the_process_group_is_refused(env) -> None:
    built_before = DataLoader(Ids(), batch_size=4, rank=1, world_size=2)
    with one_process_group():
        with pytest.raises(WorldError, match="process group is rank 0 of 1"):
            iter(built_before)
        with pytest.raises(WorldError, match="process group is rank 0 of 1"):
            DataLoader(Ids(), batch_size=4, world_size=2)
        assert len(list(DataLoader(Ids(), batch_size=4, rank=0, world_size=1))) == 10
