"""Ring buffers: reused when the user drops batches, never overwritten while held."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from batch_equality import assert_tensors_equal

from stoker.loader.read.arrow import ArrowSource
from stoker.loader.fastpath.ring import BufferRing
from stoker.manifest import Manifest


def test_slot_reused_only_after_every_view_is_gone() -> None:
    ring = BufferRing(depth=2)
    slot = ring.acquire()
    held = torch.from_numpy(slot.array("x", (4, 3), np.float32))
    ring.release(slot)
    assert ring.acquire() is not slot  # a view is alive: a second slot
    del held
    assert ring.acquire() is slot
    assert ring.allocations == 2


def test_full_ring_hands_out_one_off_slots() -> None:
    ring = BufferRing(depth=1)
    a = ring.acquire()
    b = ring.acquire()  # `a` is busy and the ring is full
    assert b is not a and len(ring) == 1


def test_steady_state_allocates_nothing(mixed_dataset: Path) -> None:
    src = ArrowSource(Manifest.load(mixed_dataset), features=["f0", "f1"], categoricals=["c0"])
    rng = np.random.default_rng(1)
    batch = src.fetch(rng.permutation(111)[:32])
    pointers = set()
    for _ in range(20):  # the usual loop: the previous batch is dropped when the next arrives
        batch = src.fetch(rng.permutation(111)[:32])
        pointers.add(batch["features"].data_ptr())
    assert src.ring.allocations <= 2 and len(pointers) <= 2


def test_held_batches_are_never_overwritten(mixed_dataset: Path) -> None:
    src = ArrowSource(Manifest.load(mixed_dataset), features=["f0", "f1"], ring_depth=2)
    rng = np.random.default_rng(2)
    kept = [(ids, src.fetch(ids)) for ids in (rng.permutation(111)[:20] for _ in range(6))]
    slow = ArrowSource(Manifest.load(mixed_dataset), features=["f0", "f1"], fast=False)
    for ids, batch in kept:
        expected = slow.fetch(ids)
        assert_tensors_equal(batch["id"], expected["id"], "id")
        assert_tensors_equal(batch["features"], expected["features"], "features")


def test_depth_must_be_positive() -> None:
    with pytest.raises(ValueError, match="depth=0"):
        BufferRing(depth=0)
