"""Errors that say what happened and what to do (issue 14, hole 8).

A 403 from an HTTP store is "access refused" with the status, URL and fix, never "no manifest
found"; a backend that is not installed names the ``pip install 'stoker[...]'`` extra; an
unreadable value in a Parquet input is a typed error naming the file, row group and column;
a loader waiting for cache room says so long before it gives up.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fault_server import Fault

from stoker.manifest import Manifest, ManifestError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from shard_writer import write_dataset  # noqa: E402


@pytest.mark.remote
@pytest.mark.parametrize("status,says", [
    (403, "HTTP 403 Forbidden when reading the manifest; the server refused access"),
    (401, "HTTP 401 Unauthorized when reading the manifest; the server wants credentials"),
    (404, "HTTP 404 Not Found when reading the manifest; there is no manifest.json there"),
    (500, "HTTP 500 Internal Server Error when reading the manifest; the server failed"),
])
def test_http_status_url_and_fix(fault_server, tmp_path: Path, status: int, says: str) -> None:
    write_dataset(tmp_path / "d", [pa.table({"x": [1, 2, 3]})])
    fault_server.put_dir(tmp_path / "d", prefix="ds")
    fault_server.plan("ds/manifest.json", Fault.status_code(status))
    with pytest.raises(ManifestError) as info:
        Manifest.load(f"{fault_server.url}/ds")
    text = str(info.value)
    assert text.startswith(f"{fault_server.url}/ds/manifest.json: {says}"), text
    assert "no manifest found" not in text
    assert Manifest.load(f"{fault_server.url}/ds").num_samples == 3  # the fault was one request


@pytest.mark.remote
def test_credentials_in_the_url_are_sent_but_never_shown(fault_server, tmp_path: Path) -> None:
    write_dataset(tmp_path / "d", [pa.table({"x": [1, 2, 3]})])
    fault_server.put_dir(tmp_path / "d", prefix="ds")
    fault_server.plan("ds/manifest.json", Fault.status_code(403))
    url = fault_server.url.replace("http://", "http://me:s3cret@")
    with pytest.raises(ManifestError) as info:
        Manifest.load(f"{url}/ds")
    assert "s3cret" not in str(info.value) and "HTTP 403" in str(info.value)
    sent = dict(fault_server.requests("ds/manifest.json")[-1].headers)
    assert sent.get("Authorization", "").startswith("Basic ")


def test_a_missing_backend_names_the_extra() -> None:
    assert importlib.util.find_spec("gcsfs") is None  # not in the test extra, on purpose
    with pytest.raises(ManifestError, match=r"pip install 'stoker\[gcs\]'"):
        Manifest.load("gs://some-bucket/dataset")


def test_unreadable_parquet_value_names_file_row_group_and_column(tmp_path: Path) -> None:
    from stoker.sharder import shard
    from stoker.sharder.errors import SourceValueError

    src = tmp_path / "in.parquet"
    table = pa.table({"a": np.arange(300, dtype=np.int64), "b": np.arange(300.0)})
    pq.write_table(table, src, row_group_size=100, compression="none")
    page = pq.ParquetFile(src).metadata.row_group(1).column(1).data_page_offset
    data = bytearray(src.read_bytes())
    data[page:page + 8] = b"\xff" * 8  # row group 1, column "b": a page header nobody can read
    src.write_bytes(bytes(data))
    with pytest.raises(SourceValueError) as info:
        shard(str(src), str(tmp_path / "out"), progress=False)
    err = info.value
    assert (err.path, err.row_group, err.column) == (str(src), 1, "b")
    assert f"{str(src)!r}, row group 1, column 'b'" in str(err) and "--columns" in str(err)
    assert isinstance(err, ValueError)


def test_waiting_for_cache_room_is_said_before_giving_up(tmp_path: Path, caplog) -> None:
    from stoker.cache import ShardCache

    m = write_dataset(tmp_path / "d", [pa.table({"x": np.arange(i * 50, (i + 1) * 50)})
                                      for i in range(3)])
    limit = int(m.shard_bytes.max())  # room for one shard: a second waits for the first
    holder = ShardCache(m, tmp_path / "cache", limit=limit, prefetch_workers=0)
    waiter = ShardCache(m, tmp_path / "cache", limit=limit, prefetch_workers=0)
    done = threading.Event()

    def read_another() -> None:
        with waiter.pin(1):
            done.set()

    with caplog.at_level(logging.WARNING, logger="stoker.cache"):
        with holder.pin(0):  # another process's reader, in effect (its own locks)
            t = threading.Thread(target=read_another)
            t.start()
            deadline = time.monotonic() + 30  # a liveness bound, not a timing assertion
            while not any("waiting for" in r.getMessage() for r in caplog.records) \
                    and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not done.is_set()  # still waiting, and it said so
        t.join(30)
    assert done.is_set()  # the pin went through once the room was freed: no deadlock
    (line,) = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    assert f"shard 1 is waiting for" in line and f"cache limit {limit} bytes" in line
    assert "raise the cache limit" in line
    holder.close()
    waiter.close()
