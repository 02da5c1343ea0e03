"""What a stoker batch holds: columns, features, lists, strings; vs a slow reference."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest
import torch

from stoker.loader import DataLoader, ReadOptions, ShuffleOptions
from stoker.loader.order.mixture_order import source_order
from stoker.loader.order.schedule import rank_batch_ids
from stoker.manifest import Manifest, ManifestError


def _reference_rows(path) -> dict[int, dict]:
    m = Manifest.load(path)
    rows = {}
    for i in range(m.num_shards):
        for r in pa.ipc.open_file(m.shard_location(i)).read_all().to_pylist():
            rows[r["id"]] = r
    return rows


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_batches_match_reference_rows(tmp_path, compression) -> None:
    from loader_helpers import make_dataset

    make_dataset(tmp_path, [13, 29, 7], compression=compression, batch_rows=5)
    ref = _reference_rows(tmp_path)
    dl = DataLoader(tmp_path, batch_size=11, seed=4, num_workers=2,
                    shuffle=ShuffleOptions(partitions=2))
    seen = 0
    for batch in dl:
        ids = batch["id"].tolist()
        assert batch["x"].dtype == torch.float32 and batch["y"].dtype == torch.int32
        lengths = batch["seq_lengths"].tolist()
        for j, i in enumerate(ids):
            row = ref[i]
            assert batch["x"][j].item() == row["x"] and batch["y"][j].item() == row["y"]
            assert batch["name"][j] == row["name"]
            assert lengths[j] == len(row["seq"])
            assert batch["seq"][j, :lengths[j]].tolist() == row["seq"]
            assert not batch["seq"][j, lengths[j]:].any()
        seen += len(ids)
    assert seen == 49


def test_features_and_columns(dataset) -> None:
    dl = DataLoader(dataset, batch_size=8, columns=["id"], read=ReadOptions(features=["x", "y"]))
    batch = next(iter(dl))
    assert set(batch) == {"id", "features"}
    assert batch["features"].dtype == torch.float32 and batch["features"].shape == (8, 2)
    ids = batch["id"].numpy()
    np.testing.assert_array_equal(batch["features"][:, 0].numpy(), (ids * 0.5).astype(np.float32))
    np.testing.assert_array_equal(batch["features"][:, 1].numpy(), ids % 7)


def test_unknown_column_is_a_clear_error(dataset) -> None:
    with pytest.raises(ManifestError, match="no column named 'nope'"):
        DataLoader(dataset, columns=["id", "nope"])


def test_collate_fn_receives_the_column_dict(dataset) -> None:
    dl = DataLoader(dataset, batch_size=4, columns=["id"], collate_fn=lambda b: b["id"] * 2)
    assert next(iter(dl)).tolist() == [0, 2, 4, 6]


def test_len_and_epoch_advance(dataset) -> None:
    dl = DataLoader(dataset, batch_size=100, shuffle=True, seed=0)
    assert len(dl) == 7 and dl.epoch == 0
    first = [b["id"].tolist() for b in dl]
    assert dl.epoch == 1 and len(first) == 7
    second = [b["id"].tolist() for b in dl]
    assert first != second
    dl.set_epoch(0)
    assert [b["id"].tolist() for b in dl] == first


def test_temporal_columns_become_their_raw_int64_values() -> None:
    import datetime

    from stoker.loader.fastpath.convert import stack_features, table_to_batch

    table = pa.table({
        "d": pa.array([datetime.date(2020, 1, 2), None], pa.date32()),
        "ts": pa.array([1, 2], pa.timestamp("ms")),
        "t": pa.array([3, None], pa.time64("us")),
    })
    batch = table_to_batch(table)
    assert batch["d"].tolist() == [18263, 0] and batch["d"].dtype == torch.int64
    assert batch["ts"].tolist() == [1, 2] and batch["t"].tolist() == [3, 0]
    assert stack_features(table, ["d", "ts", "t"]).tolist() == [[18263.0, 1.0, 3.0], [0.0, 2.0, 0.0]]


def test_a_shuffled_epoch_s_ids_come_from_chunks_computed_ahead_and_equal_the_order(
        tmp_path) -> None:
    """Past its first chunk, a shuffled epoch's ids are computed on the loader's order thread
    (``stoker-order``): the batches hold exactly ``rank_batch_ids``'s ids, whether the chunk
    came from the thread or, after ``close``, inline; the thread stops with the loader."""
    from loader_helpers import make_dataset

    make_dataset(tmp_path, [9000, 7000, 11000])  # 27,000 rows: two chunks of 16,384
    dl = DataLoader(str(tmp_path), batch_size=1000, shuffle=True, seed=5, columns=["id"])
    order = source_order(dl._source, 5, 0, dl.order_options)
    want = [rank_batch_ids(order, dl._plan, s).tolist() for s in range(len(dl))]
    assert [b["id"].tolist() for b in dl] == want
    assert dl._order_thread._pool is not None
    assert any(t.name.startswith("stoker-order") for t in threading.enumerate())
    dl.close()
    assert dl._order_thread._pool is None
    dl.set_epoch(0)
    got = [b["id"].tolist() for b in dl]  # inline now
    assert got == want
    got[17][3] += 1
    assert got != want  # the comparison can fail
