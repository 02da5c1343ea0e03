"""The fast path inside ArrowSource / DataLoader returns exactly what the pyarrow path returns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from batch_equality import assert_batches_equal

from stoker.loader import DataLoader, ReadOptions
from stoker.loader.read.arrow import ArrowSource
from stoker.manifest import Manifest

FEATURES = ["f0", "f1", "f2", "flag"]
CATS = ["c0", "c1"]


_same = assert_batches_equal  # exact and NaN-aware (tests/support/batch_equality.py)


@pytest.mark.parametrize("features,cats", [([], []), (FEATURES, []), (FEATURES, CATS)])
def test_fast_equals_pyarrow_path(mixed_dataset: Path, features: list[str],
                                  cats: list[str]) -> None:
    m = Manifest.load(mixed_dataset)
    fast = ArrowSource(m, features=features, categoricals=cats)
    slow = ArrowSource(m, features=features, categoricals=cats, fast=False)
    assert fast.fast and not slow.fast
    rng = np.random.default_rng(0)
    for size in (1, 5, 64, 111):  # 111 = whole dataset: every shard and record batch
        ids = rng.permutation(111)[:size]
        _same(fast.fetch(ids), slow.fetch(ids))
    assert fast._data and all(d is not None for d in fast._data.values())


def test_the_comparison_fails_on_a_one_value_perturbation(mixed_dataset: Path) -> None:
    """The equality above can fail: one changed value of any kind is caught."""
    m = Manifest.load(mixed_dataset)
    src = ArrowSource(m, features=FEATURES, categoricals=CATS, fast=False)
    batch = src.fetch(np.arange(111)[::-1].copy())
    batch["features"][3, 1] = float("nan")  # NaNs present: they must not hide a difference
    checked = 0
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.numel():
            flat = value.clone().reshape(-1)
            i = int((~flat.isnan()).nonzero()[0]) if value.is_floating_point() else 0
            flat[i] = torch.nextafter(flat[i], flat[i] + 1) if value.is_floating_point() \
                else (flat[i] + 1 if value.dtype != torch.bool else ~flat[i])
            changed = dict(batch, **{key: flat.reshape(value.shape)})
        elif isinstance(value, list) and value:
            j = next(i for i, v in enumerate(value) if v is not None)
            v = value[j]
            other = v + ("x" if isinstance(v, str) else b"x") if isinstance(v, (str, bytes)) \
                else [v]
            changed = dict(batch, **{key: value[:j] + [other] + value[j + 1:]})
        else:
            continue
        with pytest.raises(AssertionError):
            assert_batches_equal(batch, changed)
        checked += 1
    nan_moved = batch["features"].clone()
    row, col = (nan_moved.isnan()).nonzero()[0].tolist()
    nan_moved[row, col] = 0.0  # a NaN replaced by a number
    with pytest.raises(AssertionError):
        assert_batches_equal(batch, dict(batch, features=nan_moved))
    assert checked >= 5
    again = src.fetch(np.arange(111)[::-1].copy())
    again["features"][3, 1] = float("nan")
    assert_batches_equal(batch, again)  # equal (NaN at the same place) passes


def test_compressed_shards_fall_back(tmp_path: Path) -> None:
    from fastpath_helpers import mixed_table, write_dataset

    m = write_dataset(tmp_path, [mixed_table(30, 0, 1), mixed_table(20, 30, 2)], "zstd")
    fast = ArrowSource(m, features=FEATURES, categoricals=CATS)
    slow = ArrowSource(m, features=FEATURES, categoricals=CATS, fast=False)
    ids = np.arange(50)[::-1].copy()
    _same(fast.fetch(ids), slow.fetch(ids))
    assert fast._data and all(d is None for d in fast._data.values())  # not zero-copy


def test_dataloader_categoricals_option(mixed_dataset: Path) -> None:
    dl = DataLoader(mixed_dataset, batch_size=16, shuffle=True, seed=3, columns=["id", "seq"],
                    num_workers=2,
                    read=ReadOptions(features=FEATURES, categoricals=CATS))
    batches = list(dl)
    first = batches[0]
    assert list(first) == ["features", "categoricals", "id", "seq", "seq_lengths"]
    assert first["features"].dtype == torch.float32 and first["features"].shape == (16, 4)
    assert first["categoricals"].dtype == torch.int64 and first["categoricals"].shape == (16, 2)
    ids = torch.cat([b["id"] for b in batches]).tolist()
    assert sorted(ids) == list(range(111))
    slow = ArrowSource(Manifest.load(mixed_dataset), features=FEATURES, categoricals=CATS,
                       columns=["id", "seq"], fast=False)
    for b in batches:  # batches kept by the user are never overwritten by later ones
        _same(b, slow.fetch(b["id"].numpy()))


def test_categoricals_must_be_integers(mixed_dataset: Path) -> None:
    with pytest.raises(ValueError, match="categoricals.*'f0'.*integer"):
        DataLoader(mixed_dataset, batch_size=4, read=ReadOptions(categoricals=["f0"]))
    with pytest.raises(ValueError, match="both features= and categoricals="):
        DataLoader(mixed_dataset, batch_size=4,
                   read=ReadOptions(features=["c0"], categoricals=["c0"]))
