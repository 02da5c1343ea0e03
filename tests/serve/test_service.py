"""``DataLoader(..., workers=WorkerOptions(service=[...]))`` against real ``stoker serve``
processes on loopback.

Every comparison is bitwise (tests/support/batch_equality) against the local loader with the
same arguments; datasets are W1-shaped rows and JPEG images, shuffle on, two epochs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batch_equality import assert_batches_equal
from serve_data import W1_KW, image_kw
from stoker.loader import DataLoader, WorkerOptions
from stoker.loader.service.client import rendezvous
from stoker.loader.service.errors import ServiceRefusedError
from stoker.loader.service.options import Service
from stoker_server import StokerServer

pytestmark = [pytest.mark.remote, pytest.mark.timeout(300)]


def _kw(kind: str) -> dict[str, Any]:
    return dict(batch_size=32, shuffle=True, seed=11,
                **(W1_KW if kind == "w1" else image_kw()))


def _epochs(loader: DataLoader, epochs: tuple[int, ...] = (0, 1)) -> list[dict[str, Any]]:
    out = []
    for e in epochs:
        loader.set_epoch(e)
        out += [{k: (v.clone() if hasattr(v, "clone") else v) for k, v in b.items()}
                for b in loader]
    return out


def _assert_same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert len(a) == len(b), (len(a), len(b))
    for x, y in zip(a, b):
        assert_batches_equal(x, y)


@pytest.mark.parametrize("kind", ["w1", "images"])
@pytest.mark.parametrize("n", [1, 2])
def test_batches_bitwise_equal_to_local(kind: str, n: int, w1: Path, images: Path,
                                        two_servers: list[StokerServer]) -> None:
    path = w1 if kind == "w1" else images
    local = _epochs(DataLoader(path, **_kw(kind)))
    urls = [s.url for s in two_servers[:n]]
    # no hedging here (a hedge sent after 60 s): which server answers is then the routing's
    # choice alone, not a race a slow first request (a server's Numba start-up) can lose
    loader = DataLoader(path, workers=WorkerOptions(service=Service(tuple(urls), hedge_min=60.0)),
                        **_kw(kind))
    _assert_same(local, _epochs(loader))
    replies = loader._source._client.stats.replies
    # the servers that answered are exactly those ranked first for some batch's affinity (the
    # shard of its first sample; the label is the global id); which servers those are depends
    # on the ports (tests/serve/test_routing.py)
    source = loader._source
    primaries = {rendezvous(urls, source.fingerprint,
                            source.shard_of(b["label"][:1].numpy()))[0] for b in local}
    assert set(replies) == primaries
    assert sum(replies.values()) == len(local)
    loader.close()


def test_a_perturbed_batch_is_caught(w1: Path, two_servers: list[StokerServer]) -> None:
    local = _epochs(DataLoader(w1, **_kw("w1")), (0,))
    served = _epochs(DataLoader(w1, workers=WorkerOptions(service=[two_servers[0].url]),
                                **_kw("w1")), (0,))
    served[3]["features"][5, 7] += 1e-6
    with pytest.raises(AssertionError):
        _assert_same(local, served)


@pytest.mark.parametrize("first", ["local", "service"])
def test_resume_across_local_and_service(first: str, w1: Path,
                                         two_servers: list[StokerServer]) -> None:
    urls = [s.url for s in two_servers]
    make = {"local": lambda: DataLoader(w1, **_kw("w1")),
            "service": lambda: DataLoader(w1, workers=WorkerOptions(service=urls), **_kw("w1"))}
    second = "service" if first == "local" else "local"
    ref = _epochs(make["local"]())
    a = make[first]()
    it = iter(a)
    head = [next(it) for _ in range(5)]
    state = a.state_dict()
    a.close()
    b = make[second]()
    b.load_state_dict(state)
    rest = [{k: v.clone() for k, v in x.items()} for x in b]
    b.set_epoch(1)
    rest += _epochs(b, (1,))
    _assert_same(ref, head + rest)


def test_same_ledger_content_as_local(w1: Path, two_servers: list[StokerServer],
                                      tmp_path: Path) -> None:
    from stoker.loader.ledger.reader import read_ledger

    def steps(path: Path, **kw: Any) -> tuple[list[tuple[int, int, int]], list[list[int]]]:
        loader = DataLoader(w1, ledger=path, **_kw("w1"), **kw)
        _epochs(loader, (0,))
        loader.close()
        seg = read_ledger(path).segments[0]
        return ([(int(r["step"]), int(r["count"]), int(r["digest"])) for r in seg.steps],
                seg.content.tolist())

    local = steps(tmp_path / "local.ledger")
    served = steps(tmp_path / "served.ledger",
                   workers=WorkerOptions(service=[s.url for s in two_servers]))
    assert served == local and len(local[0]) == 34


def test_refusals_are_clear_and_the_server_keeps_serving(
        w1: Path, images: Path, two_servers: list[StokerServer], tmp_path: Path) -> None:
    import pyarrow.flight as flight

    from serve_data import w1_dataset

    other = w1_dataset(tmp_path / "other", shards=(100, 90))  # not served
    urls = [s.url for s in two_servers]
    with pytest.raises(ServiceRefusedError) as info:
        next(iter(DataLoader(other, workers=WorkerOptions(service=Service(urls, timeout=10)),
                             **_kw("w1"))))
    message = str(info.value)
    assert all(u in message for u in urls) and "is not served here" in message
    client = flight.FlightClient(urls[0])
    for ticket, words in ((b"{not json", "not UTF-8 JSON"),
                          (b'{"format": "stoker.batch-key/1"}', "missing"),
                          (json.dumps({"format": "stoker.batch-key/0"}).encode(), "format")):
        with pytest.raises(flight.FlightServerError, match=words):
            client.do_get(flight.Ticket(ticket)).read_all()
    _assert_same(_epochs(DataLoader(images, **_kw("images")), (0,)),
                 _epochs(DataLoader(images, workers=WorkerOptions(service=urls), **_kw("images")), (0,)))
    status = json.loads(list(client.do_action(flight.Action("status", b"")))[0].body
                        .to_pybytes())
    assert status["refused"] >= 4 and status["healthy"] and len(status["datasets"]) == 2


def test_token(w1: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stoker.tools.cli import main

    secret = tmp_path / "token"
    secret.write_text("s3cret\n")
    with StokerServer([w1], "--token-file", str(secret)) as server:
        with pytest.raises(ServiceRefusedError, match="needs a token"):
            next(iter(DataLoader(w1, workers=WorkerOptions(service=[server.url]), **_kw("w1"))))
        wrong = Service([server.url], token="nope")
        with pytest.raises(ServiceRefusedError, match="has another"):
            next(iter(DataLoader(w1, workers=WorkerOptions(service=wrong), **_kw("w1"))))
        good = Service([server.url], token_file=str(secret))
        _assert_same(_epochs(DataLoader(w1, **_kw("w1")), (0,)),
                     _epochs(DataLoader(w1, workers=WorkerOptions(service=good), **_kw("w1")), (0,)))
        assert main(["serve", "--status", server.url, "--token-file", str(secret)]) == 0
        status = json.loads(capsys.readouterr().out)
        assert status["batches"] == 34 and status["refused"] == 0
        assert main(["serve", "--status", server.url]) == 1  # no token: refused, exit 1
