"""Failover, hedging, graceful stop and server-side transforms, with real servers."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from batch_equality import assert_batches_equal
from serve_data import W1_KW
from stoker.loader import DataLoader, WorkerOptions
from stoker.loader.service.errors import ServiceUnavailableError
from stoker.loader.service.options import Service
from stoker_server import StokerServer

pytestmark = [pytest.mark.remote, pytest.mark.timeout(300)]

HERE = str(Path(__file__).resolve().parent)
ENV = {"PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
KW: dict[str, Any] = dict(batch_size=32, shuffle=True, seed=5, **W1_KW)


def _copy(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v.clone() for k, v in batch.items()}


def _local(path: Path, epochs: tuple[int, ...] = (0, 1), **kw: Any) -> list[dict[str, Any]]:
    loader = DataLoader(path, **KW, **kw)
    out = []
    for e in epochs:
        loader.set_epoch(e)
        out += [_copy(b) for b in loader]
    return out


def test_all_servers_down_names_every_url(w1: Path) -> None:
    servers = [StokerServer([w1]) for _ in range(2)]
    urls = [s.url for s in servers]
    for s in servers:
        s.stop()
    loader = DataLoader(w1, workers=WorkerOptions(service=Service(urls, timeout=3.0)), **KW)
    t0 = time.monotonic()
    with pytest.raises(ServiceUnavailableError) as info:
        next(iter(loader))
    elapsed = time.monotonic() - t0
    assert sorted(info.value.tried) == sorted(urls)
    assert all(u in str(info.value) for u in urls) and "timeout=3 s" in str(info.value)
    assert elapsed < 3.0 + 5.0  # raised at the deadline (slack for a loaded machine)
    loader.close()


def test_a_stalled_server_is_hedged_around(w1: Path) -> None:
    expected = _local(w1)
    with StokerServer([w1]) as a, StokerServer([w1]) as b:
        service = Service([a.url, b.url], timeout=60.0, hedge_min=0.05)
        loader = DataLoader(w1, workers=WorkerOptions(service=service), **KW)
        got = []
        for e in (0, 1):
            loader.set_epoch(e)
            for batch in loader:
                got.append(_copy(batch))
                if len(got) == 20:  # stall the server that served most so far (HRW by port)
                    replies = loader._source._client.stats.replies
                    stalled = max((a, b), key=lambda s: replies.get(s.url, 0))
                    stalled.pause()  # SIGSTOP: connections stay open, nothing answers
        stats = loader._source._client.stats
        stalled.resume()
        loader.close()
    assert len(got) == len(expected)
    for x, y in zip(expected, got):
        assert_batches_equal(x, y)
    assert stats.hedges >= 1 and stats.hedges_won >= 1 and stats.mismatches == 0


def test_sigterm_lets_in_flight_requests_finish(w1: Path) -> None:
    server = StokerServer([w1], "--transform", "serve_transforms:slow", env=ENV)
    service = Service([server.url], timeout=60.0, transform="serve_transforms:slow")
    loader = DataLoader(w1, workers=WorkerOptions(service=service), **KW)
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.append(_copy(next(iter(loader)))))
    reader.start()
    time.sleep(0.7)  # the first keys are in the 1.5 s transform now
    assert server.stop() == 0  # SIGTERM: exits cleanly once the requests in flight are done
    reader.join(timeout=60)
    assert len(got) == 1
    assert_batches_equal(got[0], _local(w1, (0,))[0])
    loader.close()


def test_server_side_transform_by_name(w1: Path, tmp_path: Path) -> None:
    from serve_transforms import jitter

    from stoker.loader.ledger.reader import read_ledger

    expected = _local(w1, (0,), transform=jitter, ledger=tmp_path / "local.ledger")
    with StokerServer([w1], "--transform", "serve_transforms:jitter", env=ENV) as server:
        service = Service([server.url], transform="serve_transforms:jitter")
        loader = DataLoader(w1, ledger=tmp_path / "served.ledger",
                            workers=WorkerOptions(service=service),
                            **KW)
        got = [_copy(b) for b in loader]
        loader.close()
    assert len(got) == len(expected)
    for x, y in zip(expected, got):
        assert_batches_equal(x, y)
    local, served = read_ledger(tmp_path / "local.ledger"), read_ledger(tmp_path / "served.ledger")
    transform = served.header["service"]["transform"]
    assert transform["name"] == "serve_transforms:jitter"
    assert transform["version"].startswith("source:")
    assert served.segments[0].content.tolist() == local.segments[0].content.tolist()
