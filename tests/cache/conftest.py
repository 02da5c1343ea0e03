"""Fixtures for the cache tests: synthetic datasets and real servers on loopback.

``tests/servers`` holds the server helpers as plain modules; it is put on ``sys.path`` here so
any test folder can reuse them the same way.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pytest

SERVERS = Path(__file__).resolve().parents[1] / "servers"
if str(SERVERS) not in sys.path:
    sys.path.insert(0, str(SERVERS))

from server_fixtures import fault_server, nginx  # noqa: E402,F401 - shared fixtures
from s3_server import S3Server  # noqa: E402

from stoker.manifest import Manifest, ShardInfo, hash_file  # noqa: E402

SCHEMA = pa.schema([("id", pa.int64()), ("x", pa.float32()), ("blob", pa.binary())])


def build_dataset(root: Path, n_shards: int = 6, rows: int = 400, batches: int = 4,
                  compression: str = "none", blob: int = 64, seed: int = 0,
                  grow: int = 7) -> Manifest:
    """Write ``n_shards`` Arrow IPC shards and their manifest (shard s has rows + grow*s rows)."""
    rng = np.random.default_rng(seed)
    (root / "shards").mkdir(parents=True, exist_ok=True)
    infos = []
    start = 0
    options = pa.ipc.IpcWriteOptions(compression="zstd" if compression == "zstd" else None)
    for s in range(n_shards):
        n = rows + grow * s
        per = [n // batches + (1 if b < n % batches else 0) for b in range(batches)]
        rel = f"shards/{s:05d}.arrow"
        with pa.OSFile(str(root / rel), "wb") as sink, \
                pa.ipc.new_file(sink, SCHEMA, options=options) as writer:
            for count in per:
                ids = np.arange(start, start + count, dtype=np.int64)
                # Compressible payload (repeated bytes) so zstd shards are smaller on disk.
                blobs = [bytes([int(i) % 251]) * blob for i in ids]
                writer.write_batch(pa.record_batch(
                    [pa.array(ids), pa.array(rng.random(count, dtype=np.float32)),
                     pa.array(blobs, pa.binary())], schema=SCHEMA))
                start += count
        digest, size = hash_file(root / rel)
        infos.append(ShardInfo(rel, n, size, digest, tuple(per)))
    manifest = Manifest.create(schema=SCHEMA, shards=infos, sources=[], options={"seed": seed},
                               stoker_version="0.1.0", compression=compression)
    manifest.save(root)
    return Manifest.load(root)


@pytest.fixture
def dataset(tmp_path: Path) -> Callable[..., tuple[Path, Manifest]]:
    """``dataset(**kw)`` -> (directory, manifest) of a fresh synthetic dataset."""
    counter = iter(range(1000))

    def make(**kw: object) -> tuple[Path, Manifest]:
        root = tmp_path / f"ds{next(counter)}"
        return root, build_dataset(root, **kw)  # type: ignore[arg-type]

    return make


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    pytest.importorskip("moto.server", reason="moto[server] is in the test extra")
    pytest.importorskip("s3fs", reason="s3fs is in the test extra")
    with S3Server(key="AKIAEXAMPLEKEY123", secret="sEcReT/PaSsWoRd+42") as server:
        yield server
