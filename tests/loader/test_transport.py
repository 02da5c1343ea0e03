"""A worker process's batch crosses as tensor bytes (stoker.loader.workers.transport), through
the pipe or a shared-memory ring: the consumer gets the same dtypes, shapes and bytes in new
tensors (copies, or views of a ring slot lent until they are collected), what cannot go as
bytes keeps torch's own reduction, no slot a caller holds is written again, and a slot that
holds another batch than announced is an error, never a wrong batch."""

from __future__ import annotations

from multiprocessing.reduction import ForkingPickler
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
import torch.multiprocessing  # noqa: F401 - registers torch's reductions on ForkingPickler

from stoker.loader.fallbacks import collecting, drain
from stoker.loader.workers.transport import (BY_BYTES_MAX, SLOT_BYTES, Answers, Ring, RingError,
                                             dumps)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """dtype, shape and every byte (NaN-aware: bytes, not values)."""
    return a.dtype == b.dtype and a.shape == b.shape and \
        a.reshape(-1).contiguous().view(torch.uint8).tolist() == \
        b.reshape(-1).contiguous().view(torch.uint8).tolist()


BATCH = {
    "features": torch.tensor([[1.5, float("nan")], [float("-inf"), -0.0]], dtype=torch.float32),
    "categoricals": torch.tensor([[3, -7], [2**40, 0]], dtype=torch.int64),
    "flags": torch.tensor([True, False]),
    "half": torch.tensor([0.25, 65504.0], dtype=torch.float16),
    "scalar": torch.tensor(7, dtype=torch.int16),
    "pairs": [torch.arange(6, dtype=torch.uint8).reshape(2, 3), (torch.zeros(0, 4),)],
}


def test_a_batch_round_trips_byte_for_byte() -> None:
    back = ForkingPickler.loads(dumps(BATCH))
    for key in ("features", "categoricals", "flags", "half", "scalar"):
        assert _same(back[key], BATCH[key]), key
    assert _same(back["pairs"][0], BATCH["pairs"][0])
    assert _same(back["pairs"][1][0], BATCH["pairs"][1][0])
    back["features"][0, 0] = 9.0  # a new, writable tensor: the original is untouched
    assert BATCH["features"][0, 0] == 1.5


def test_the_comparison_sees_one_changed_byte() -> None:
    other = BATCH["features"].clone()
    other[1, 1] = 0.0  # -0.0 -> +0.0: equal as values, not as bytes
    assert not _same(other, BATCH["features"])


def test_plain_tensors_travel_as_bytes_and_the_rest_as_torch_shares_them() -> None:
    big = torch.ones(1 << 16, dtype=torch.float32)
    assert len(dumps(big)) >= big.numel() * 4  # the bytes are in the message
    for other in (torch.ones(1 << 16, dtype=torch.bfloat16),  # no NumPy dtype
                  torch.ones(1 << 17)[::2],  # a strided view
                  torch.ones(1 << 16, requires_grad=True),
                  torch.ones(BY_BYTES_MAX // 4 + 1)):  # large: sharing beats two copies
        raw = dumps(other)
        assert len(raw) < 4096  # torch's reduction: a handle to shared memory, not the data
        assert torch.equal(ForkingPickler.loads(raw).detach(), other.detach())


@pytest.mark.parametrize("dtype", [torch.float64, torch.int8, torch.int32, torch.complex64])
def test_every_numpy_dtype_keeps_its_dtype(dtype: torch.dtype) -> None:
    t = torch.arange(12).reshape(3, 4).to(dtype)
    assert _same(ForkingPickler.loads(dumps(t)), t)


@pytest.fixture
def ring():
    r = Ring(slots=3, slot_bytes=1 << 20)
    yield r
    r.close()


def _check_batch(back: dict) -> None:
    for key in ("features", "categoricals", "flags", "half", "scalar"):
        assert _same(back[key], BATCH[key]), key
    assert _same(back["pairs"][0], BATCH["pairs"][0])
    assert _same(back["pairs"][1][0], BATCH["pairs"][1][0])


def test_a_batch_round_trips_through_the_ring_byte_for_byte(ring: Ring) -> None:
    raw = ring.put(BATCH)
    assert raw[:1] == b"R" and len(raw) < 256  # a slot reference, not the data
    back = ring.loads(raw)
    _check_batch(back)
    ring.put({"other": torch.full((4096,), 7.0)})  # the next slots are written again ...
    ring.put({"other": torch.full((4096,), 8.0)})
    ring.put({"other": torch.full((4096,), 9.0)})  # ... this one reuses the first slot
    _check_batch(back)  # the consumer's tensors own their bytes: the slot is free once read
    back["features"][0, 0] = 5.0
    assert BATCH["features"][0, 0] == 1.5


def test_the_ring_keeps_large_plain_tensors_as_bytes_and_odd_ones_as_torch_shares_them(
) -> None:
    ring = Ring(slots=3, slot_bytes=4 << 20)
    big = torch.arange(BY_BYTES_MAX // 8 + 100, dtype=torch.int64)  # over the pipe's limit
    strided = torch.ones(1 << 12)[::2]
    back = ring.loads(ring.put({"big": big, "strided": strided}))
    ring.close()
    assert _same(back["big"], big) and not back["big"].is_shared()
    assert torch.equal(back["strided"], strided)


def test_what_does_not_fit_a_slot_goes_through_the_pipe(ring: Ring) -> None:
    huge = {"names": [bytes([i % 251]) * 1000 + str(i).encode() for i in range(2000)],
            "x": torch.ones(3)}  # 2 MB of distinct bytes, pickled in band: over a slot
    raw = ring.put(huge)
    assert raw[:1] != b"R"
    back = ring.loads(raw)
    assert back["names"] == huge["names"] and torch.equal(back["x"], huge["x"])
    assert SLOT_BYTES >= 256 * 64 * 64 * 3  # the default slot holds a W2 batch of pixels


def test_a_full_ring_sends_through_the_pipe_and_overwrites_nothing(ring: Ring) -> None:
    with collecting() as noted:
        first = ring.put({"x": torch.zeros(8)})
        for value in range(3):  # three slots: the fourth batch finds none free
            raw = ring.put({"x": torch.full((8,), float(value))})
    assert raw[:1] != b"R" and noted["ring_full"][0] == 1
    assert torch.equal(ring.loads(first)["x"], torch.zeros(8))
    assert torch.equal(ring.loads(raw)["x"], torch.full((8,), 2.0))


def test_a_slot_that_holds_another_batch_than_announced_is_an_error(ring: Ring) -> None:
    first = ring.put({"x": torch.zeros(8)})
    ring._view[:8] = 0xFF  # the slot header's stamp, as if written again
    with pytest.raises(RingError, match="overwritten before it was read"):
        ring.loads(first)


def test_a_lent_batch_views_its_slot_until_the_last_tensor_goes() -> None:
    ring = Ring(slots=2, slot_bytes=1 << 20, leases=2)
    held = ring.loads(ring.put(BATCH))
    _check_batch(held)
    state = ring._state
    assert state.tolist() == [2, 0, 0, 0]  # lent
    feature = held["features"]
    del held  # one tensor still views the slot
    assert state.tolist() == [2, 0, 0, 0]
    feature[0, 0] = 4.0  # writable, like torch's shared batches
    assert BATCH["features"][0, 0] == 1.5
    del feature
    assert state.tolist() == [0, 0, 0, 0]
    ring.close()


def test_batches_held_past_the_leases_are_copies_and_nothing_held_is_written_again() -> None:
    ring = Ring(slots=2, slot_bytes=1 << 20, leases=2)
    with collecting() as noted:
        held = [ring.loads(ring.put({"x": torch.full((1000,), float(i))})) for i in range(40)]
    assert ring._state.tolist() == [2, 2, 0, 0]  # two lent, the rest copied out
    assert noted["batch_copied"][0] == 38
    for i, batch in enumerate(held):
        assert torch.equal(batch["x"], torch.full((1000,), float(i))), i
    del held
    assert ring._state.tolist() == [0, 0, 0, 0]
    ring.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.booleans()), min_size=1, max_size=60))
def test_no_batch_a_reader_holds_changes_whatever_it_keeps(steps: list[tuple[int, bool]]
                                                           ) -> None:
    """A writer that keeps at most ``slots - 1`` batches unread and a reader that keeps and
    drops batches at random: every batch read equals what was put, for as long as it is
    held, and the writer never runs out of slots."""
    ring = Ring(slots=3, slot_bytes=1 << 16, leases=2)
    unread: list[tuple[int, bytes]] = []
    held: dict[int, dict] = {}
    n = 0
    for puts, keep in steps:
        for _ in range(min(puts, 2 - len(unread))):
            n += 1
            raw = ring.put({"x": torch.full((64,), float(n))})
            assert raw[:1] == b"R"  # never the pipe: a slot was always free
            unread.append((n, raw))
        if unread:
            i, raw = unread.pop(0)
            batch = ring.loads(raw)
            if keep:
                held[i] = batch
            elif held:
                held.pop(min(held))
        for i, batch in held.items():
            assert torch.equal(batch["x"], torch.full((64,), float(i))), (i, n)
    held.clear()
    batch = None  # the last one read
    assert ring._state.tolist().count(2) == 0  # every slot free once nothing is held
    ring.close()


class Answer(NamedTuple):  # the shape of a worker's answer (stoker.loader.epoch_iter.Delivered)
    batch: dict
    content: list | None
    fallbacks: dict


PLAIN = {key: value for key, value in BATCH.items() if key != "pairs"}
PLAIN["empty"] = torch.zeros(0, 4)


def test_a_plain_answer_crosses_as_its_layout_and_comes_back_byte_for_byte() -> None:
    ring = Ring(slots=2, slot_bytes=1 << 20, leases=2)
    raw = ring.put(((3, 7), Answer(PLAIN, [11, 2**63 - 1], {"compiling": (1, "x")})))
    assert raw[:1] == b"P" and len(raw) < 1024  # names, dtypes, shapes: not the data
    key, back = ring.loads(raw)
    assert key == (3, 7) and type(back) is Answer
    assert back.content == [11, 2**63 - 1] and back.fallbacks == {"compiling": (1, "x")}
    assert list(back.batch) == list(PLAIN)  # the keys' order too
    for name, tensor in PLAIN.items():
        assert _same(back.batch[name], tensor), name
    assert ring._state.tolist() == [2, 0, 0, 0]  # lent until the last tensor goes
    back.batch["features"][0, 0] = 4.0  # writable; the worker's tensor is untouched
    assert PLAIN["features"][0, 0] == 1.5
    del back
    assert ring._state.tolist() == [0, 0, 0, 0]
    ring.close()


def test_an_answer_with_anything_else_in_its_batch_is_pickled_whole(ring: Ring) -> None:
    for odd in (BATCH["pairs"], torch.ones(4, dtype=torch.bfloat16), torch.ones(8)[::2]):
        answer = Answer({"x": torch.arange(3), "odd": odd}, None, {})
        raw = ring.put(("k", answer))
        assert raw[:1] == b"R"
        key, back = ring.loads(raw)
        assert key == "k" and _same(back.batch["x"], answer.batch["x"])
        assert str(back.batch["odd"]) == str(odd)


def test_plain_answers_held_past_the_leases_are_copies_and_stay_intact() -> None:
    ring = Ring(slots=2, slot_bytes=1 << 20, leases=2)
    drain()  # notes earlier tests made outside any collecting() block
    with collecting() as noted:
        held = [ring.loads(ring.put((i, Answer({"x": torch.full((1000,), float(i))}, None, {}))))
                for i in range(12)]
    assert noted["batch_copied"][0] == 10 and ring._state.tolist() == [2, 2, 0, 0]
    for i, (key, answer) in enumerate(held):
        assert key == i and torch.equal(answer.batch["x"], torch.full((1000,), float(i)))
    del held, answer
    assert ring._state.tolist() == [0, 0, 0, 0]
    ring.close()


def _group(ring: Ring, n: int, rows: int = 1000) -> list[tuple[Any, Any]]:
    items = [((0, i), Answer({"x": torch.full((rows,), float(i)), "i": torch.tensor([i])},
                             [i], {})) for i in range(n)]
    return [(item, ring.plain(item)) for item in items]


def test_a_group_of_plain_answers_is_one_message_and_shares_one_lent_slot() -> None:
    ring = Ring(slots=2, slot_bytes=1 << 20, leases=2)
    raw = ring.put_group(_group(ring, 8), ring.borrow())
    assert raw is not None and raw[:1] == b"G" and len(raw) < 2048
    back = ring.loads(raw)
    assert isinstance(back, Answers) and [key for key, _ in back] == [(0, i) for i in range(8)]
    for i, (_, answer) in enumerate(back):
        assert answer.content == [i] and list(answer.batch) == ["x", "i"]
        assert _same(answer.batch["x"], torch.full((1000,), float(i)))
        assert _same(answer.batch["i"], torch.tensor([i]))
    assert ring._state.tolist() == [2, 0, 0, 0]  # one slot, lent
    last = back[-1][1].batch["i"]
    del back, answer
    assert ring._state.tolist() == [2, 0, 0, 0]  # a tensor of one batch keeps the group's slot
    del last
    assert ring._state.tolist() == [0, 0, 0, 0]
    ring.close()


def test_a_group_that_does_not_fit_a_slot_is_refused(ring: Ring) -> None:
    region = ring.borrow()
    assert ring.put_group(_group(ring, 8, rows=40_000), region) is None  # 1.28 MB > 1 MiB
    assert ring._state.tolist() == [1, 0, 0]  # still the worker's: nothing announced
    ring.give_back(region)
    assert ring._state.tolist() == [0, 0, 0]


def test_groups_held_past_the_leases_are_copied_batch_by_batch() -> None:
    ring = Ring(slots=2, slot_bytes=1 << 20, leases=2)
    drain()
    with collecting() as noted:
        held = [ring.loads(ring.put_group(_group(ring, 4), ring.borrow())) for _ in range(3)]
    assert noted["batch_copied"][0] == 4 and ring._state.tolist() == [2, 2, 0, 0]
    for group in held:
        for i, (_, answer) in enumerate(group):
            assert _same(answer.batch["x"], torch.full((1000,), float(i)))
    del held, group, answer
    assert ring._state.tolist() == [0, 0, 0, 0]
    ring.close()


def test_a_group_gathered_into_a_borrowed_slot_is_sent_without_a_copy() -> None:
    ring = Ring(slots=2, slot_bytes=1 << 16, leases=2)
    region = ring.borrow()
    assert region is not None and ring._state.tolist() == [1, 0, 0, 0]
    group = region.array("x", (4, 1000), np.float32)  # what a source's group gather fills
    group[:] = np.arange(4, dtype=np.float32)[:, None]
    items = []
    for i in range(4):
        item = ((0, i), Answer({"x": torch.from_numpy(group[i]),  # in the slot
                                "i": torch.tensor([i])}, [i], {}))  # elsewhere: copied in
        items.append((item, ring.plain(item)))
    raw = ring.put_group(items, region)
    group[0, 0] = 9.0  # the consumer views the bytes the gather wrote, not a copy of them
    back = ring.loads(raw)
    assert _same(back[0][1].batch["x"][1:], torch.zeros(999)) and back[0][1].batch["x"][0] == 9
    for i, (key, answer) in enumerate(back[1:], 1):
        assert key == (0, i) and _same(answer.batch["x"], torch.full((1000,), float(i)))
        assert _same(answer.batch["i"], torch.tensor([i]))
    del back, answer, group, items, item
    assert ring._state.tolist() == [0, 0, 0, 0]
    ring.close()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64, torch.int8,
                                   torch.int16, torch.int32, torch.int64, torch.uint8,
                                   torch.bool, torch.complex64, torch.complex128], ids=str)
def test_a_group_keeps_every_dtype_and_shape(dtype: torch.dtype) -> None:
    """A group's layout names each tensor's NumPy dtype and shape from the tensor itself
    (put_group makes no array for a tensor already in the slot): same values back."""
    ring = Ring(slots=2, slot_bytes=1 << 16, leases=2)
    region = ring.borrow()
    assert region is not None
    values = torch.arange(24).reshape(2, 3, 4).to(dtype)
    inside = torch.from_numpy(region.array("x", (2, 3, 4), values.numpy().dtype))
    inside.copy_(values)
    item = ((0, 0), Answer({"x": inside, "y": values[1]}, [0], {}))  # in the slot, copied in
    back = ring.loads(ring.put_group([(item, ring.plain(item))], region))
    batch = back[0][1].batch
    assert batch["x"].dtype == dtype and batch["x"].shape == (2, 3, 4)
    assert batch["x"].numpy().tobytes() == values.numpy().tobytes()
    assert batch["y"].dtype == dtype and batch["y"].numpy().tobytes() == values[1].numpy().tobytes()
    del back, batch
    ring.close()


def test_a_borrowed_slot_too_small_for_the_group_is_given_back() -> None:
    ring = Ring(slots=2, slot_bytes=1 << 12, leases=2)
    region = ring.borrow()
    big = region.array("x", (1020,), np.float32)  # past the slot after its header: private
    assert region.offset_at(big.__array_interface__["data"][0], big.nbytes) is None
    item = (0, Answer({"x": torch.from_numpy(big)}, None, {}))
    assert ring.put_group([(item, ring.plain(item))], region) is None
    ring.give_back(region)
    assert ring._state.tolist() == [0, 0, 0, 0]
    ring.close()
