"""States saved under the defaults before issue 12 (partitions=32, block_size = 4 x median
shard rows) are refused with the options that continue them, and continue exactly with them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stoker.loader import DataLoader, ShuffleOptions
from stoker.loader.errors import StateError
from stoker.loader.order.epoch import OrderOptions
from stoker.manifest import Manifest

from loader_helpers import ids_of  # noqa: E402


def test_a_state_of_the_old_defaults_names_them_and_continues_with_them(dataset: Path) -> None:
    rows = Manifest.load(str(dataset)).shard_rows
    old = OrderOptions(partitions=32).resolve(rows)  # what the loader used to choose
    kw = dict(batch_size=16, shuffle=True, seed=4)
    old_spelled = ShuffleOptions(partitions=old.partitions, block_size=old.block_size)
    then = DataLoader(str(dataset), **{**kw, "shuffle": old_spelled})
    it = iter(then)
    for _ in range(3):
        next(it)
    state = then.state_dict()
    expected = ids_of(it)
    now = DataLoader(str(dataset), **kw)
    assert now.order_options != old
    with pytest.raises(StateError) as err:
        now.load_state_dict(state)
    assert f"partitions={old.partitions}, block_size={old.block_size}" in str(err.value)
    again = DataLoader(str(dataset), **{**kw, "shuffle": old_spelled})
    again.load_state_dict(state)
    got = ids_of(again)
    assert got == expected and len(np.concatenate(got)) > 0
