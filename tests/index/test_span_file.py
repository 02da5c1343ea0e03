"""A row group of indexed Parquet is decoded from the bytes its check hashed
(stoker.loader.read.indexed.span_file): read once, and a file changed on disk between the
check and the decode cannot slip bytes past the check."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stoker.loader.fastpath.ring import BufferRing
from stoker.loader.read.indexed.source import IndexSource
from stoker.loader.read.indexed.span_file import SpanFile, read_span
from stoker.manifest import Manifest
from stoker.tools.cli import main


@pytest.fixture()
def indexed(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    x = np.arange(600, dtype=np.int64)
    pq.write_table(pa.table({"x": x, "y": (x * 0.5).astype(np.float32)}), root / "a.parquet",
                   row_group_size=100, compression="none")
    assert main(["index", str(root), "--quiet"]) == 0
    return root


def test_a_group_is_decoded_from_the_bytes_its_check_read(indexed: Path) -> None:
    manifest = Manifest.load(indexed)
    source = IndexSource(manifest, columns=["x", "y"], row_major=False)
    assert source._verified_group(0, 3).column("x").to_pylist() == list(range(300, 400))
    source._ahead.wait((0, 4))  # group 4 was checked ahead while group 3 was read
    assert (0, 4) in source._spans
    lo, hi, _ = manifest.shards[0].extra["digests"]["row_groups"][4]
    path = indexed / "a.parquet"
    raw = bytearray(path.read_bytes())
    x_values = raw[lo:hi].find(np.int64(450).tobytes())
    assert x_values > 0
    raw[lo + x_values] ^= 0x01  # 450 -> 451 on disk, after the check, same size
    path.write_bytes(bytes(raw))
    got = source._verified_group(0, 4)
    assert got.column("x").to_pylist() == list(range(400, 500))  # the bytes that were checked
    assert (0, 4) not in source._spans  # read once: a later read goes to the file
    assert pq.ParquetFile(path).read_row_group(4).column("x")[50].as_py() == 451
    source.close()


def test_a_span_file_serves_its_span_from_memory_and_the_rest_from_the_file(
        tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(bytes(range(200)))
    fd = os.open(path, os.O_RDONLY)
    try:
        span = read_span(fd, 50, 150, BufferRing(1))
        assert bytes(span) == bytes(range(50, 150))
        assert bytes(read_span(fd, 150, 260, BufferRing(1))) == bytes(range(150, 200))  # short
    finally:
        os.close(fd)
    span[10] = 0  # what the span holds is what is read inside it
    f = SpanFile(str(path), 200, 50, span)
    f.seek(55)
    assert bytes(f.read(10)) == bytes([55, 56, 57, 58, 59, 0, 61, 62, 63, 64])
    f.seek(-60, os.SEEK_END)
    assert bytes(f.read(20)) == bytes(range(140, 160))  # across its end: the file's bytes
    assert f.tell() == 160 and f.size() == 200
    f.seek(0)
    assert bytes(f.read(3)) == bytes([0, 1, 2])
    f.close()
