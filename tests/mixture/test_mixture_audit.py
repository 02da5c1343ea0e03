"""Ledgers and audits of mixture runs: header, blend replay, per-source passes, proportions."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from stoker.loader import DataLoader, LedgerOptions
from stoker.loader.ledger.writer import LedgerWriter, read_ledger
from stoker.loader.order.mixture import Mixture
from stoker.tools.audit import audit
from stoker.tools.audit.html import render_html
from stoker.tools.cli import main

SCHEDULE = [(90, {"web": 1, "code": 3, "books": 1})]


def _mixture(sources) -> Mixture:
    return Mixture({n: str(p) for n, p in sources.items()},
                   {"web": math.sqrt(2), "code": math.sqrt(3), "books": math.sqrt(5)}, SCHEDULE)


def _run(mix: Mixture, ledger: Path | LedgerOptions, epochs: int = 3, **kw) -> None:
    dl = DataLoader(mix, batch_size=kw.pop("batch_size", 16), shuffle=True, seed=31,
                    ledger=ledger, **kw)
    for e in range(epochs):
        dl.set_epoch(e)
        for _ in dl:
            pass
    dl.close()


def _status(report) -> dict[str, str]:
    return {c.name: c.status for c in report.checks}


def test_ledger_header_records_the_mixture(sources, tmp_path: Path) -> None:
    mix = _mixture(sources)
    _run(mix, tmp_path / "a.ledger", epochs=1)
    head = read_ledger(tmp_path / "a.ledger").segments[0].header
    assert head["kind"] == "mixture" and head["fingerprint"] == mix.fingerprint
    described = head["mixture"]
    assert described["names"] == ["web", "code", "books"]
    assert [s["fingerprint"] for s in described["sources"]] == [m.fingerprint for m in
                                                                mix.manifests]
    segments = described["blend"]["segments"]
    assert [s for s, _ in segments] == [0, 90]
    assert segments[1][1] == ["1/5", "3/5", "1/5"]


def test_audit_of_a_resumed_multi_worker_mixture_run_passes(sources, tmp_path: Path,
                                                            capsys) -> None:
    mix = _mixture(sources)
    path = tmp_path / "run.ledger"
    kw = dict(batch_size=16, shuffle=True, seed=31, ledger=path)
    dl = DataLoader(mix, num_workers=2, **kw)
    for i, _ in enumerate(dl):
        if i == 4:
            break
    state = dl.state_dict()
    dl.close()
    resumed = DataLoader(mix, num_workers=0, **kw)
    resumed.load_state_dict(state)
    while resumed.epoch < 3:
        for _ in resumed:
            pass
    resumed.close()
    report = audit(path)
    status = _status(report)
    assert status["replay"] == "pass" and status["sources"] == "pass", report.to_json()
    assert status["proportions"] == "pass" and status["resumes"] == "pass"
    assert status["integrity"] == "pass" and report.reproducible
    content = report.check("content")  # the merged batches rebuilt across the resume
    assert content.status == "pass" and content.details["steps_checked"] == \
        content.details["steps_recorded"] > 0, content.details
    rows = {r["source"]: r for r in report.check("proportions").details["sources"]}
    assert all(abs(r["deviation"]) < 2 for r in rows.values())
    assert "Realised proportions" in render_html(report)
    assert main(["audit", str(path)]) == 0
    capsys.readouterr()


def test_world_size_two_run_is_replayed_per_rank(sources, tmp_path: Path) -> None:
    mix = _mixture(sources)
    for r in range(2):
        _run(mix, tmp_path / "run/", epochs=2, batch_size=8, rank=r, world_size=2)
    report = audit(tmp_path / "run")
    assert _status(report)["replay"] == "pass" and report.reproducible, report.to_json()
    sources_check = report.check("sources").details["sources"]
    assert sum(s["consumed"] for s in sources_check) == 2 * mix.num_samples


def test_recorded_ids_prove_every_pass(sources, tmp_path: Path) -> None:
    mix = _mixture(sources)
    _run(mix, LedgerOptions(tmp_path / "ids.ledger", ids=True), epochs=4)
    report = audit(tmp_path / "ids.ledger")
    assert report.reproducible, report.to_json()
    for src in report.check("sources").details["sources"]:
        assert src["passes_complete"] >= 1
        for p in src["passes"]:
            assert p["duplicates"] == 0 and p["distinct_proven"] == p["consumed"]


def test_a_sample_read_twice_in_a_pass_fails(sources, tmp_path: Path) -> None:
    mix = _mixture(sources)
    clean = tmp_path / "clean.ledger"
    _run(mix, LedgerOptions(clean, ids=True), epochs=1)
    led = read_ledger(clean)
    head = {k: v for k, v in led.segments[0].header.items() if k != "content"}
    bad = tmp_path / "bad.ledger"
    with LedgerWriter(bad, head, ids=True) as w:
        for rec, ids in zip(led.segments[0].steps, np.split(led.segments[0].ids, np.cumsum(
                led.segments[0].steps["count"])[:-1])):
            ids = ids.copy()
            if int(rec["step"]) == 3:  # one web sample twice (97 samples: one pass here)
                web = np.flatnonzero(ids < mix.offsets[1])
                ids[web[1]] = ids[web[0]]
            w.step(int(rec["epoch"]), int(rec["step"]), int(rec["rank"]), ids, 0.0, 0.0)
    report = audit(bad)
    status = _status(report)
    assert status["replay"] == "fail"
    assert report.check("replay").details["first_mismatch"]["step"] == 3
    assert status["sources"] == "fail" and "consumed twice" in report.check("sources").summary
    assert audit(clean).reproducible  # the same steps untouched pass


def test_changed_weights_are_refused(sources, tmp_path: Path) -> None:
    mix = _mixture(sources)
    _run(mix, tmp_path / "a.ledger", epochs=1)
    spec = tmp_path / "mixture.json"
    spec.write_text(json.dumps({"sources": {n: str(p) for n, p in sources.items()},
                                "weights": {"web": 1, "code": 1, "books": 1}}))
    report = audit(tmp_path / "a.ledger", dataset=str(spec))
    assert _status(report)["replay"] == "fail"
    assert "its sources or weights changed" in report.check("replay").summary


def test_inspect_prints_a_mixture_file(sources, tmp_path: Path, capsys) -> None:
    spec = tmp_path / "mixture.json"
    spec.write_text(json.dumps({"sources": {n: str(p) for n, p in sources.items()},
                                "weights": {"web": 2, "code": 1, "books": 1},
                                "schedule": [[500, {"web": 1, "code": 1, "books": 2}]]}))
    assert main(["inspect", str(spec), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["samples_per_epoch"] == 150 and info["exact_weights"]
    assert [s["samples"] for s in info["sources"]] == [97, 40, 13]
    assert info["schedule"][0]["weights"] == {"web": "1/2", "code": "1/4", "books": "1/4"}
    assert info["schedule"][1]["position"] == 500
    assert main(["inspect", str(spec)]) == 0
    text = capsys.readouterr().out
    assert "web: 97 samples" in text and "from          500  web 0.2500" in text
    assert main(["inspect", str(sources["web"])]) == 0  # a dataset still inspects as before
    assert "samples      97" in capsys.readouterr().out
