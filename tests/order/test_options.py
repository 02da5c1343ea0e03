"""OrderOptions validation, resolution and round trips; clear errors for impossible requests."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stoker.loader.order.epoch import (
    ORDER_ALGORITHM,
    EpochOrder,
    OrderError,
    OrderOptions,
    derive_seed,
)
from stoker.manifest import StokerError


@pytest.mark.parametrize("kw, words", [
    ({"partitions": 0}, "partitions must be a positive int"),
    ({"partitions": -2}, "got -2"),
    ({"partitions": True}, "partitions"),
    ({"partitions": 2.0}, "partitions"),
    ({"block_size": -1}, "block_size must be an int >= 0"),
    ({"block_size": 1.5}, "block_size"),
    ({"partition_mode": "shuffle"}, "partition_mode must be one of ('redraw', 'fixed')"),
    ({"shuffle": "yes"}, "shuffle must be True or False"),
])
def test_invalid_options_raise_clear_errors(kw, words) -> None:
    with pytest.raises(OrderError, match=None) as info:
        OrderOptions(**kw)
    assert words in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, StokerError)


def test_resolve_fills_block_size_from_shard_sizes() -> None:
    rows = np.array([10, 0, 30, 20, 1000], dtype=np.int64)
    assert OrderOptions().resolve(rows).block_size == 4 * 30  # upper median of non-empty rows
    assert OrderOptions(block_size=7).resolve(rows).block_size == 7
    assert OrderOptions().resolve(np.zeros(3, dtype=np.int64)).block_size == 4
    assert OrderOptions().resolve(np.array([], dtype=np.int64)).block_size == 4
    resolved = OrderOptions(partitions=4).resolve(rows)
    assert resolved.resolve(rows) == resolved
    assert OrderOptions(shuffle=False, partitions=8, partition_mode="fixed").resolve(rows) == \
        OrderOptions(shuffle=False, partitions=1, block_size=1, partition_mode="redraw")


def test_to_dict_from_dict_round_trip_is_json_plain() -> None:
    opts = OrderOptions(partitions=16, block_size=4096, partition_mode="fixed")
    d = json.loads(json.dumps(opts.to_dict()))
    assert d == {"algorithm": ORDER_ALGORITHM, "shuffle": True, "partitions": 16,
                 "block_size": 4096, "partition_mode": "fixed"}
    assert OrderOptions.from_dict(d) == opts
    assert OrderOptions.from_dict({"partitions": 2}) == OrderOptions(partitions=2)
    with pytest.raises(OrderError, match="unknown order option"):
        OrderOptions.from_dict({"partitions": 2, "blocksize": 3})
    with pytest.raises(OrderError, match="written by algorithm 'stoker.order/0'"):
        OrderOptions.from_dict({**d, "algorithm": "stoker.order/0"})


def test_derive_seed_is_64_bit_and_depends_on_every_input() -> None:
    base = derive_seed("fp", 1, 2, 3)
    assert 0 <= base < 2**64
    assert base == derive_seed("fp", 1, 2, 3)
    others = {derive_seed("fq", 1, 2, 3), derive_seed("fp", 2, 2, 3), derive_seed("fp", 1, 3, 3),
              derive_seed("fp", 1, 2, 4), derive_seed("fp", 1, 2), derive_seed("fp", 1, 2, 3, 0)}
    assert base not in others and len(others) == 6
    assert derive_seed("fp", 2**64 - 1, 0) != derive_seed("fp", -1, 0)
    with pytest.raises(OrderError, match="seed must be an int"):
        derive_seed("fp", 1.0, 0)  # type: ignore[arg-type]
    with pytest.raises(OrderError, match="fingerprint must be a str"):
        derive_seed(b"fp", 1, 0)  # type: ignore[arg-type]


def test_impossible_requests_raise_clear_errors() -> None:
    order = EpochOrder(np.array([5, 6, 7]), "fp", 0, 0, OrderOptions(partitions=4))
    with pytest.raises(OrderError, match="world_size 3 does not divide partitions=4"):
        order.rank_ids(0, 10, 0, 3)
    with pytest.raises(OrderError, match="world_size 8 does not divide"):
        order.shard_sequence(0, 10, 0, 8)
    with pytest.raises(OrderError, match=r"rank must be in \[0, world_size=2\), got 2"):
        order.rank_ids(0, 10, 2, 2)
    with pytest.raises(OrderError, match="world_size must be >= 1"):
        order.rank_ids(0, 10, 0, 0)
    with pytest.raises(OrderError, match=r"0 <= start <= stop <= num_samples = 18"):
        order.ids(0, 19)
    with pytest.raises(OrderError, match="start <= stop"):
        order.ids(5, 4)
    with pytest.raises(OrderError, match=r"positions must be in \[0, 18\)"):
        order.ids_at(np.array([0, 18]))
    with pytest.raises(OrderError, match="positions must be integers"):
        order.ids_at(np.array([0.5]))
    with pytest.raises(OrderError, match="epoch must be >= 0"):
        EpochOrder(np.array([5]), "fp", 0, -1, OrderOptions())
    with pytest.raises(OrderError, match=r"shard_rows\[1\] is -3"):
        EpochOrder(np.array([5, -3]), "fp", 0, 0, OrderOptions())
    with pytest.raises(OrderError, match="1-D integer array"):
        EpochOrder(np.array([[5]]), "fp", 0, 0, OrderOptions())
    with pytest.raises(OrderError, match="1-D integer array"):
        EpochOrder(np.array([5.0]), "fp", 0, 0, OrderOptions())
    with pytest.raises(OrderError, match="options must be an OrderOptions"):
        EpochOrder(np.array([5]), "fp", 0, 0, {"partitions": 2})  # type: ignore[arg-type]
