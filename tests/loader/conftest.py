"""Small stoker datasets for loader tests, built directly with pyarrow (no sharder needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from stoker.manifest import Manifest, ShardInfo, hash_file, stoker_version

sys.path.insert(0, str(Path(__file__).parent))  # for loader_helpers (importlib mode)


def make_dataset(root: Path, shard_rows: list[int], compression: str = "none",
                 batch_rows: int = 16) -> Manifest:
    """A dataset whose column ``id`` equals the global sample id (so order is observable)."""
    (root / "shards").mkdir(parents=True, exist_ok=True)
    shards, start = [], 0
    table = None
    for s, n in enumerate(shard_rows):
        ids = np.arange(start, start + n, dtype=np.int64)
        start += n
        table = pa.table({
            "id": ids,
            "x": (ids * 0.5).astype(np.float32),
            "y": (ids % 7).astype(np.int32),
            "seq": pa.array([[float(i)] * int(i % 3) for i in ids], pa.list_(pa.float32())),
            "name": [f"s{i}" for i in ids],
        })
        path = f"shards/{s:05d}.arrow"
        opts = pa.ipc.IpcWriteOptions(compression=None if compression == "none" else compression)
        with pa.OSFile(str(root / path), "wb") as f, pa.ipc.new_file(f, table.schema, options=opts) as w:
            batches = table.to_batches(max_chunksize=batch_rows) or [table.to_batches()[0]]
            for b in batches:
                w.write_batch(b)
        digest, size = hash_file(root / path)
        shards.append(ShardInfo(path, n, size, digest, tuple(b.num_rows for b in batches)))
    manifest = Manifest.create(schema=table.schema, shards=shards, sources=[], options={},
                               stoker_version=stoker_version(), compression=compression)
    manifest.save(root)
    return Manifest.load(root)


@pytest.fixture(scope="session")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """19 shards of 20-45 rows (615 samples): uneven, so tails and straddles are exercised."""
    root = tmp_path_factory.mktemp("ds")
    make_dataset(root, [20 + (7 * i) % 26 for i in range(19)])
    return root


@pytest.fixture(scope="session")
def other_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ds_other")
    make_dataset(root, [30, 30, 30])
    return root
