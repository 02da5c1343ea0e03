"""Content digests computed by the fast path (issue 14): the same ``stoker.content/1`` values
as the reference definition, byte for byte.

The fast path digests the NumPy arrays its kernels have just written
(``ArrowSource.fetch_digested`` with ``batch_digests(..., arrays)``) instead of the tensors the
audit digests; both must give the digests the plain pyarrow path gives, for every column kind
and both ways of gathering (column kernels, row-major records), and change with one value.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # for fastpath_helpers (importlib mode)

from fastpath_helpers import record_table, write_dataset  # noqa: E402

from stoker.loader.ledger.digest import (array_digest, batch_digests, content_header,  # noqa: E402
                                         value_digest)
from stoker.loader.read.arrow import ArrowSource  # noqa: E402
from stoker.manifest import Manifest  # noqa: E402

DTYPES = [np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32,
          np.float64]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0,), (1,), (7,), (5, 3), (4, 0), (2, 3, 4)])
def test_array_digest_is_the_tensor_digest(dtype: Any, shape: tuple[int, ...]) -> None:
    a = (np.arange(int(np.prod(shape))) % 5).astype(dtype).reshape(shape)
    assert array_digest(a) == value_digest(torch.from_numpy(a))
    assert array_digest(a) == array_digest(a.copy())  # the cached seed serves equal arrays


def test_array_digest_of_a_strided_array_is_the_tensor_digest() -> None:
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    array_digest(np.ascontiguousarray(base[:, ::2]))  # caches the seed of that dtype/shape
    view = base[:, ::2]
    assert array_digest(view) == value_digest(torch.from_numpy(view))


def test_array_digest_changes_with_one_value() -> None:
    a = np.zeros((64, 8), dtype=np.float32)
    before = array_digest(a)
    a[31, 5] = 1e-30
    assert array_digest(a) != before
    assert array_digest(a) == value_digest(torch.from_numpy(a))


def test_arrays_with_lengths_give_the_reference_digests() -> None:
    values = np.arange(12, dtype=np.float32).reshape(4, 3)
    lengths = np.array([3, 0, 2, 1], dtype=np.int64)
    batch = {"seq": torch.from_numpy(values), "seq_lengths": torch.from_numpy(lengths),
             "id": torch.arange(4)}
    reference = batch_digests(batch, ["seq", "id"])
    arrays = {"seq": values, "seq_lengths": lengths}
    assert batch_digests(batch, ["seq", "id"], arrays) == reference
    # without the lengths' array the column goes through its tensors: same digests
    assert batch_digests(batch, ["seq", "id"], {"seq": values}) == reference
    lengths[1] = 1
    assert batch_digests(batch, ["seq", "id"], arrays)[0] != reference[0]


def _reference(m: Manifest, ids: np.ndarray, digested: list[str], **read: Any) -> list[int]:
    """What the audit computes: the plain pyarrow path, tensors hashed."""
    plain = ArrowSource(m, fast=False, row_major=False, **read)
    try:
        return batch_digests(plain.fetch(ids), digested)
    finally:
        plain.close()


def _digest(columns: list[str]) -> Any:
    """What the loader hands ``fetch_digested`` (stoker.loader.epoch_iter.BatchTask)."""
    def digest(batch: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[int]:
        assert arrays  # the fast path hands its arrays over
        return batch_digests(batch, columns, arrays)
    return digest


def _orders(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [rng.permutation(n)[:29], np.arange(n)[5:45], rng.permutation(n)[:1]]


@pytest.mark.parametrize("row_major", [False, True])
def test_fast_path_digests_are_the_reference_for_every_column_kind(
        mixed_dataset: Path, row_major: bool) -> None:
    m = Manifest.load(mixed_dataset)
    read = dict(columns=["id", "flag", "seq", "blob", "name", "pt"], features=["f0", "f1", "f2"],
                categoricals=["c0", "c1"])
    src = ArrowSource(m, row_major=row_major, **read)  # type: ignore[arg-type]
    assert src.fast
    columns = content_header(src)["columns"]
    try:
        src.fetch(np.arange(int(m.shard_rows.sum())))  # opens every shard (records: built)
        src.wait_row_major()
        for ids in _orders(int(m.shard_rows.sum())):
            batch, digests = src.fetch_digested(ids, 0, 0, _digest(columns))
            assert digests == batch_digests(batch, columns) == _reference(m, ids, columns, **read)
            assert src.fetch_digested(ids, 0, 0, None)[1] is None
    finally:
        src.close()


@pytest.fixture(scope="module")
def records_dataset(tmp_path_factory: pytest.TempPathFactory) -> Manifest:
    tables = [record_table(n, start, s) for s, (n, start) in enumerate([(60, 0), (45, 60)])]
    return write_dataset(tmp_path_factory.mktemp("digest_records"), tables, batch_rows=8)


def test_record_served_digests_are_the_reference_and_follow_one_value(
        records_dataset: Manifest) -> None:
    m = records_dataset
    read = dict(columns=["id", "seq"], features=["f0", "f1"], categoricals=["c0"])
    src = ArrowSource(m, row_major=True, **read)  # type: ignore[arg-type]
    columns = content_header(src)["columns"]
    ids = np.random.default_rng(0).permutation(105)[:40]
    try:
        src.fetch(np.arange(105))
        src.wait_row_major()
        assert src.row_major_bytes > 0  # the batch below comes from the records
        batch, digests = src.fetch_digested(ids, 0, 0, _digest(columns))
        assert digests == _reference(m, ids, columns, **read)
        batch["features"][17, 1] += 1  # one value as the user might change it afterwards
        changed = batch_digests(batch, columns)
        assert [a != b for a, b in zip(changed, digests)] == \
            [c == "features" for c in columns]
    finally:
        src.close()
