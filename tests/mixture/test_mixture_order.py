"""MixtureOrder against the written rule: any positions, any window, any rank."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import numpy as np
import pytest

from mixture_helpers import expected
from stoker.loader import DataLoader
from stoker.loader.order.mixture import Mixture
from stoker.loader.order.mixture_order import MixtureOrder, PassOrders, source_order

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


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("batch", [5, 8, 13])
def test_rank_windows_from_chunks_computed_ahead_follow_the_written_rule(
        sources, world: int, batch: int) -> None:
    """Consecutive batch windows read from chunks the background thread computed ahead (the
    chunk of 8 positions is smaller than most batches, so windows cross chunk borders and
    join the kept chunk's rest to the next), then a jump back and forth: every window is the
    written rule's."""
    mix, order, model = _order(sources, 11, 1)  # its loader is closed: a fresh thread here
    passes = PassOrders(order.passes._rows, order.passes._fps, 11, order.options)
    ahead = MixtureOrder(mix, passes, 1, chunk=8)
    L = mix.num_samples
    windows = [(s, min(L, s + batch)) for s in range(0, L, batch)]
    windows += [(3, 3 + batch), (L - batch, L), (0, batch)]
    for rank in range(world):
        for start, stop in windows:
            got = ahead.rank_ids(start, stop, rank, world)
            assert got.tolist() == [model[k] for k in range(start, stop) if k % world == rank]
    # after each rank's first window, every consecutive one came from the thread's chunks
    assert ahead.chunks_ahead >= world * (L // max(batch, 8) - 2)
    passes.close()
    wrong = model.copy()
    wrong[0] += 1
    assert ahead.rank_ids(0, 1, 0, 1).tolist() != [wrong[0]]  # the comparison can fail


@pytest.mark.parametrize("world", [1, 3])
def test_the_next_epoch_s_first_chunk_is_computed_ahead_and_follows_the_written_rule(
        sources, world: int) -> None:
    """Reading an epoch's windows to its end asks the next epoch's first chunk of the
    background thread: the next epoch's order takes it (its first window counts as a chunk
    from the thread) and every window is the written rule's; an order of another epoch
    drops it and computes its own."""
    mix, order, _ = _order(sources, 5, 0)
    passes = PassOrders(order.passes._rows, order.passes._fps, 5, order.options)
    L, rank = mix.num_samples, world - 1
    for epoch, taken in [(0, 0), (1, 1), (3, 0)]:  # epoch 2's chunk is asked, never read
        model = _order(sources, 5, epoch)[2]
        cur = MixtureOrder(mix, passes, epoch, chunk=8)
        first = cur.rank_ids(0, 6, rank, world)
        assert cur.chunks_ahead == taken, epoch
        assert first.tolist() == [model[k] for k in range(0, 6) if k % world == rank]
        if epoch == 1:
            assert passes.upcoming(2) is None  # not asked yet: epoch 1 is not at its end
        for start in range(6, L, 6):
            got = cur.rank_ids(start, min(L, start + 6), rank, world)
            want = [model[k] for k in range(start, min(L, start + 6)) if k % world == rank]
            assert got.tolist() == want, (epoch, start)
    passes.close()
    wrong = _order(sources, 5, 1)[2]
    wrong[rank] += 1
    assert MixtureOrder(mix, passes, 1).rank_ids(0, 6, rank, world).tolist() != \
        [wrong[k] for k in range(0, 6) if k % world == rank]  # the comparison can fail


def test_the_order_thread_stops_with_its_loader_and_runs_inline_after(sources) -> None:
    """Closing the loader stops the thread; chunks already asked of it are still computed
    (an order holding their futures gets its ids, not a cancellation), later ones inline."""
    mix = Mixture({n: str(p) for n, p in sources.items()}, WEIGHTS)
    dl = DataLoader(mix, batch_size=16, shuffle=True, seed=3)
    passes = source_order(dl._source, 3, 0, dl.order_options).passes
    model = expected(mix, 3, 0, mix.num_samples, dl.order_options)
    want = [mix.offsets[s] + i for s, i in model]
    gate = threading.Event()
    passes.ahead(gate.wait)  # keeps the thread busy: the chunks below wait in its queue
    order = MixtureOrder(mix, passes, 0, chunk=8)
    assert order.rank_ids(0, 16, 0, 1).tolist() == want[:16]
    assert passes._thread._pool is not None  # chunks [16, 32) and [32, 48) are queued on the thread
    assert any(t.name.startswith("stoker-order") for t in threading.enumerate())
    dl.close()
    assert passes._thread._pool is None
    gate.set()
    assert order.rank_ids(16, 32, 0, 1).tolist() == want[16:32]  # queued before close
    assert order.chunks_ahead == 1
    assert order.rank_ids(32, 80, 0, 1).tolist() == want[32:80]  # inline now, same ids
    assert passes._thread._pool is None
