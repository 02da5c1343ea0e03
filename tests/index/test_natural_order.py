"""Natural-order batches of indexed Parquet are copied out of decoded row groups' records
(stoker.loader.read.indexed.natural): bitwise the batches the pyarrow path gives, across row
groups, files, workers and a group with nulls (which pyarrow reads)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stoker.loader import DataLoader, ReadOptions, WorkerOptions
from stoker.loader.read.indexed import natural
from stoker.tools.cli import main

from staged_index import CATS, FEATS, indexed  # noqa: F401 - a fixture


def _batches(root: Path, workers: int = 0, mode: str = "thread", batch: int = 16) -> list[dict]:
    loader = DataLoader(str(root), batch_size=batch, shuffle=False, columns=["seq", "label"],
                        num_workers=workers, workers=WorkerOptions(mode=mode),
                        read=ReadOptions(features=FEATS, categoricals=CATS, records_dir=False))
    return [{k: v.numpy().copy() for k, v in b.items()} for b in loader]


def _pyarrow(root: Path, monkeypatch: pytest.MonkeyPatch, **kw) -> list[dict]:
    with monkeypatch.context() as m:
        m.setattr(natural.NaturalGroups, "gather", lambda *a, **k: None)
        return _batches(root, **kw)


def _same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b) and len(a) > 0
    for x, y in zip(a, b):
        assert sorted(x) == sorted(y)
        for k in x:  # bytes: NaNs compare equal only to the same NaN
            assert x[k].dtype == y[k].dtype and x[k].shape == y[k].shape, k
            assert x[k].tobytes() == y[k].tobytes(), k


@pytest.mark.parametrize("batch", [16, 40, 57])  # inside a group, a group, across groups and files
def test_natural_order_batches_are_the_pyarrow_paths(indexed: Path, batch: int,  # noqa: F811
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    served = []
    real = natural.NaturalGroups.gather

    def counted(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        served.append(out is not None)
        return out

    monkeypatch.setattr(natural.NaturalGroups, "gather", counted)
    got = _batches(indexed, batch=batch)
    assert sum(served) >= len(got) - 1  # all but a batch across the two files
    _same(got, _pyarrow(indexed, monkeypatch, batch=batch))


@pytest.mark.parametrize("mode,workers", [("thread", 2), ("process", 2)])
def test_workers_give_the_same_natural_order(indexed: Path, mode: str,  # noqa: F811
                                             workers: int) -> None:
    _same(_batches(indexed, workers, mode), _batches(indexed))


def test_a_group_with_nulls_is_read_by_pyarrow_with_the_same_rules(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "data"
    root.mkdir()
    rng = np.random.default_rng(5)
    f0 = pa.array([None if i % 13 == 0 and i >= 40 else float(v)
                   for i, v in enumerate(rng.random(120))], pa.float32())
    pq.write_table(pa.table({"f0": f0, "f1": rng.random(120, dtype=np.float32),
                             "f2": rng.random(120, dtype=np.float32),
                             "c0": rng.integers(0, 5, 120),
                             "seq": pa.array([[float(i)] * 4 for i in range(120)],
                                             pa.list_(pa.float32())),
                             "label": rng.integers(0, 2, 120)}), root / "a.parquet",
                   row_group_size=40)  # group 0 plain, groups 1 and 2 with nulls
    assert main(["index", str(root), "--quiet"]) == 0
    _same(_batches(root, batch=20), _pyarrow(root, monkeypatch, batch=20))
