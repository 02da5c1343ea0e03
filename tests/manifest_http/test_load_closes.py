"""``Manifest.load`` over HTTP leaves no connection open, however many threads load."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pytest

from stoker.manifest import Manifest, ShardInfo, hash_file


def _dataset(root: Path) -> Manifest:
    schema = pa.schema([("x", pa.int64())])
    (root / "shards").mkdir(parents=True)
    rel = "shards/00000.arrow"
    with pa.OSFile(str(root / rel), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        writer.write_batch(pa.record_batch([pa.array(range(10))], schema=schema))
    digest, size = hash_file(root / rel)
    manifest = Manifest.create(schema=schema, shards=[ShardInfo(rel, 10, size, digest, (10,))],
                               sources=[], options={}, stoker_version="0.1.0")
    manifest.save(root)
    return manifest


def _established(port: int) -> set[tuple[str, int]]:
    """Local ends of this process's ESTABLISHED TCP connections to ``port``."""
    return {tuple(c.laddr) for c in psutil.Process().net_connections(kind="tcp")
            if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED}


def _settled(port: int, seconds: float = 2.0) -> set[tuple[str, int]]:
    """:func:`_established` once it is empty or ``seconds`` have passed: fsspec closes a
    session on its own event-loop thread, which may lag a moment on a busy machine (a leaked
    connection stays open for good, so waiting cannot hide one)."""
    deadline = time.monotonic() + seconds
    while (open_ := _established(port)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return open_


def _load_in_threads(url: str, options: dict | None, threads: int) -> list[Manifest]:
    loaded: list[Manifest] = []
    errors: list[BaseException] = []

    def load() -> None:
        try:
            for _ in range(2):
                loaded.append(Manifest.load(url, options))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread below
            errors.append(exc)

    workers = [threading.Thread(target=load) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    if errors:
        raise errors[0]
    return loaded


@pytest.mark.parametrize("threads", [1, 4])
def test_http_load_from_threads_leaves_no_connection_open(nginx, tmp_path: Path,
                                                          threads: int) -> None:
    # nginx keeps HTTP/1.1 connections alive, so a client that does not close its session
    # leaves them ESTABLISHED (fsspec caches the filesystem, and its session, for good)
    expected = _dataset(tmp_path / "ds")
    server = nginx(tmp_path)
    loaded = _load_in_threads(f"{server.url}/ds", None, threads)
    assert [m.fingerprint for m in loaded] == [expected.fingerprint] * 2 * threads
    assert loaded[0].root == f"{server.url}/ds"
    assert _settled(server.port) == set()

