"""A shard whose row-major records the node stored is opened for its records only: pyarrow
reads its messages, the records check reads its sampled rows, and nothing else of its columns
is read from disk (stoker.loader.read.open_shards). Measured with ``mincore`` on the shard
files after evicting them from the page cache (``POSIX_FADV_DONTNEED``: no root needed), past
the file's first read-ahead window (pyarrow's memory map asks for the whole file with
``MADV_WILLNEED``, which the kernel bounds by the device's ``read_ahead_kb``)."""

from __future__ import annotations

import mmap
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for fastpath_helpers (importlib mode)

from fastpath_helpers import write_dataset  # noqa: E402

from stoker.loader.fastpath import advise  # noqa: E402
from stoker.loader.fastpath.advise import cached_pages  # noqa: E402
from stoker.loader.read.arrow import ArrowSource  # noqa: E402
from stoker.manifest import Manifest  # noqa: E402

FEATURES = [f"f{j}" for j in range(8)]
ROWS = 800_000  # per shard: 25.6 MB of columns; the check's 66 rows x 8 columns read ~2 MB


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Manifest:
    rng = np.random.default_rng(5)
    tables = [pa.table({c: rng.random(ROWS, dtype=np.float32) for c in FEATURES})
              for _ in range(2)]
    return write_dataset(tmp_path_factory.mktemp("lean"), tables, batch_rows=65_536)


def _shard_files(manifest: Manifest) -> list[str]:
    return [manifest.shard_location(s) for s in range(manifest.num_shards)]


def _evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages are not dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _read_ahead(path: str) -> int:
    """The read-ahead window in bytes of the block device holding ``path`` (0: unknown)."""
    st = os.stat(path)
    dev = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    for queue in (f"{dev}/queue/read_ahead_kb", f"{dev}/../queue/read_ahead_kb"):
        if os.path.exists(queue):
            return int(Path(queue).read_text()) * 1024
    return 0


def _resident(path: str, skip_window: bool = False) -> float:
    """Fraction of the file's pages in the page cache (past the first read-ahead window)."""
    first = _read_ahead(path) // mmap.PAGESIZE if skip_window else 0
    assert first * mmap.PAGESIZE < os.path.getsize(path) / 2, \
        "the read-ahead window covers most of the shard"
    pages = cached_pages(path)
    assert pages is not None, "mincore is not available here"
    return float(pages[first:].mean())


def _batch(source: ArrowSource, ids: np.ndarray) -> dict[str, bytes]:
    try:
        return {k: v.numpy().tobytes() for k, v in source.fetch(ids).items()}
    finally:
        source.close()


def _cold(manifest: Manifest) -> None:
    for path in _shard_files(manifest):
        _evict(path)
        assert _resident(path) < 0.01, f"{path} stayed in the page cache after DONTNEED"


def test_a_shard_whose_records_are_stored_is_read_for_them_only(dataset: Manifest,
                                                                 tmp_path: Path) -> None:
    ids = np.random.default_rng(1).permutation(2 * ROWS)[:4096]  # rows of both shards
    want = _batch(ArrowSource(dataset, features=FEATURES, row_major=False), ids)
    records = str(tmp_path / "records")
    first = ArrowSource(dataset, features=FEATURES, row_major=True, row_major_dir=records)
    first.fetch(ids)
    first.wait_row_major()  # saved: the next source maps them
    first.close()

    _cold(dataset)
    again = ArrowSource(dataset, features=FEATURES, row_major=True, row_major_dir=records)
    assert _batch(again, ids) == want
    read = [_resident(p, skip_window=True) for p in _shard_files(dataset)]
    assert max(read) < 0.2, read  # messages and the checked rows' pages (~8 %)

    _cold(dataset)  # the same, with nothing stored: each shard is read whole, to build them
    fresh = ArrowSource(dataset, features=FEATURES, row_major=True,
                        row_major_dir=str(tmp_path / "empty"))
    assert _batch(fresh, ids) == want
    assert min(_resident(p) for p in _shard_files(dataset)) > 0.9


def test_advising_a_whole_shard_reads_all_of_it(dataset: Manifest, tmp_path: Path) -> None:
    """One ``MADV_WILLNEED`` over a whole map reads ~8 MB of it (the kernel's bound), so
    :func:`advise_whole` asks in pieces: a shard whose columns are all read comes in at the
    disk's speed, not fault by fault."""
    path = str(tmp_path / "shard.arrow")  # a copy no map holds (mapped pages stay cached)
    shutil.copyfile(_shard_files(dataset)[0], path)
    assert os.path.getsize(path) > 16 << 20  # past one call's bound here (8 MB)
    _evict(path)
    assert _resident(path) < 0.01
    source = pa.memory_map(path, "r")
    arena = source.read_buffer(source.size())
    assert advise.advise_whole(arena)
    deadline = time.monotonic() + 20
    while _resident(path) < 0.99 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _resident(path) >= 0.99
