"""The fast path inside ArrowSource / DataLoader returns exactly what the pyarrow path returns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from stoker.loader import DataLoader
from stoker.loader.arrow_source import ArrowSource
from stoker.manifest import Manifest

FEATURES = ["f0", "f1", "f2", "flag"]
CATS = ["c0", "c1"]


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert list(a) == list(b)
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
            assert torch.equal(a[k], b[k]) or (a[k].isnan() == b[k].isnan()).all(), k
        else:
            assert a[k] == b[k], k


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


def test_compressed_shards_fall_back(tmp_path: Path) -> None:
    from fastpath_helpers import mixed_table, write_dataset

    m = write_dataset(tmp_path, [mixed_table(30, 0, 1), mixed_table(20, 30, 2)], "zstd")
    fast = ArrowSource(m, features=FEATURES, categoricals=CATS)
    slow = ArrowSource(m, features=FEATURES, categoricals=CATS, fast=False)
    ids = np.arange(50)[::-1].copy()
    _same(fast.fetch(ids), slow.fetch(ids))
    assert fast._data and all(d is None for d in fast._data.values())  # not zero-copy


def test_dataloader_categoricals_option(mixed_dataset: Path) -> None:
    dl = DataLoader(mixed_dataset, batch_size=16, shuffle=True, seed=3, features=FEATURES,
                    categoricals=CATS, columns=["id", "seq"], num_workers=2)
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
        DataLoader(mixed_dataset, batch_size=4, categoricals=["f0"])
    with pytest.raises(ValueError, match="both features= and categoricals="):
        DataLoader(mixed_dataset, batch_size=4, features=["c0"], categoricals=["c0"])
