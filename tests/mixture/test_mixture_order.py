"""MixtureOrder against the written rule: any positions, any window, any rank."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from mixture_helpers import expected
from stoker.loader import DataLoader
from stoker.loader.order.mixture import Mixture
from stoker.loader.order.mixture_order import source_order

WEIGHTS = {"web": math.sqrt(2), "code": math.sqrt(3), "books": math.sqrt(5)}


def _order(sources: dict[str, Path], seed: int, epoch: int):  # type: ignore[no-untyped-def]
    mix = Mixture({n: str(p) for n, p in sources.items()}, WEIGHTS)
    dl = DataLoader(mix, batch_size=16, shuffle=True, seed=seed)
    order = source_order(dl._source, seed, epoch, dl.order_options)
    model = expected(mix, seed, epoch * mix.num_samples, (epoch + 1) * mix.num_samples,
                     dl.order_options)
    dl.close()
    return mix, order, np.array([mix.offsets[s] + i for s, i in model], dtype=np.int64)


@pytest.mark.parametrize("epoch", [0, 3])
def test_ids_at_positions_in_any_order_follow_the_written_rule(sources, epoch: int) -> None:
    mix, order, model = _order(sources, 7, epoch)
    ks = np.random.default_rng(epoch).permutation(np.repeat(np.arange(mix.num_samples), 2))
    got = order.ids_at(ks.reshape(-1, 4))
    assert got.shape == (len(ks) // 4, 4)
    assert np.array_equal(got.ravel(), model[ks])
    assert np.array_equal(order.ids(0, mix.num_samples), model)
    wrong = model.copy()
    wrong[ks[0]] += 1
    assert not np.array_equal(got.ravel(), wrong[ks])  # the comparison can fail


@pytest.mark.parametrize("world", [1, 2, 3])
def test_rank_windows_follow_the_written_rule(sources, world: int) -> None:
    mix, order, model = _order(sources, 9, 2)
    L = mix.num_samples
    for rank in range(world):
        for start, stop in [(0, L), (5, 37), (37, 38), (100, L), (L, L)]:
            got = order.rank_ids(start, stop, rank, world)
            want = [model[k] for k in range(start, stop) if k % world == rank]
            assert got.tolist() == want, (rank, start, stop)
