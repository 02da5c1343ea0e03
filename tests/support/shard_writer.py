"""Write Arrow tables as a stoker dataset (one shard per table) for tests.

The one shard writer the test helpers of ``tests/fastpath``, ``tests/loader`` and
``tests/faults`` share; each builds its own tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pyarrow as pa

from stoker.manifest import Manifest, ShardInfo, hash_file, stoker_version

__all__ = ["write_dataset"]


def write_dataset(root: Path, tables: Sequence[pa.Table], compression: str = "none",
                  batch_rows: int = 7) -> Manifest:
    """One shard per table, ``batch_rows`` rows per record batch (an empty table gets one
    empty record batch), the manifest saved under ``root`` and loaded back."""
    (root / "shards").mkdir(parents=True, exist_ok=True)
    shards = []
    opts = pa.ipc.IpcWriteOptions(compression=None if compression == "none" else compression)
    for s, table in enumerate(tables):
        path = f"shards/{s:05d}.arrow"
        batches = table.to_batches(max_chunksize=batch_rows) or \
            [pa.RecordBatch.from_pylist([], schema=table.schema)]
        with pa.OSFile(str(root / path), "wb") as f, \
                pa.ipc.new_file(f, table.schema, options=opts) as w:
            for b in batches:
                w.write_batch(b)
        digest, size = hash_file(root / path)
        shards.append(ShardInfo(path, table.num_rows, size, digest,
                                tuple(b.num_rows for b in batches)))
    manifest = Manifest.create(schema=tables[0].schema, shards=shards, sources=[], options={},
                               stoker_version=stoker_version(), compression=compression)
    manifest.save(root)
    return Manifest.load(root)
