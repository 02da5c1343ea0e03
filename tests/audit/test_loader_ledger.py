"""Ledgers written by the real DataLoader: elastic resume (2 ranks -> 1) audits clean."""

from __future__ import annotations

from pathlib import Path

from stoker.loader import DataLoader, LedgerOptions, ShuffleOptions
from stoker.loader.ledger.writer import read_ledger
from stoker.tools.audit import audit


def _loader(loc: str, ledger: Path | LedgerOptions, **kw) -> DataLoader:
    return DataLoader(loc, seed=3, ledger=ledger, shuffle=ShuffleOptions(partitions=4), **kw)


def test_elastic_resume_from_two_ranks_to_one(tmp_path: Path, dataset) -> None:
    _, loc = dataset
    led = tmp_path / "runs/e.ledger"
    ranks = [_loader(loc, led, batch_size=4, rank=r, world_size=2) for r in (0, 1)]
    iters = [iter(x) for x in ranks]
    for _ in range(5):
        for it in iters:
            next(it)
    state = ranks[0].state_dict()
    for x in ranks:
        x.close()
    one = _loader(loc, led, batch_size=8, world_size=1, rank=0)
    one.load_state_dict(state)
    for _ in range(2):
        for _batch in one:
            pass
    one.close()
    straight = _loader(loc, LedgerOptions(tmp_path / "runs/s.ledger", ids=True), batch_size=8)
    for _ in range(2):
        for _batch in straight:
            pass
    straight.close()

    assert sorted(p.name for p in led.parent.glob("e*.ledger")) == [
        "e.ledger", "e.rank0.ledger", "e.rank1.ledger"]
    assert read_ledger(led).events[0]["state"]["step"] == 5
    report = audit(led, tmp_path / "runs/s.ledger")
    assert report.reproducible, report.to_json()
    assert report.check("identity").details["world_sizes"] == [1, 2]
    assert [r["step"] for r in report.check("resumes").details["resumes"]] == [5]
    assert all(e["complete"] for e in report.check("coverage").details["epochs"])
    assert report.check("comparison").details["common_steps"] == 28
    epochs = audit(tmp_path / "runs/s.ledger").check("coverage").details["epochs"]
    assert epochs[0]["method"] == "ids"


def test_elastic_resume_rolls_back_what_the_old_world_recomputed(tmp_path: Path, dataset) -> None:
    _, loc = dataset
    led = tmp_path / "runs/e.ledger"
    ranks = [_loader(loc, led, batch_size=4, rank=r, world_size=2) for r in (0, 1)]
    iters = [iter(x) for x in ranks]
    state = None
    for step in range(9):
        for it in iters:
            next(it)
        if step == 4:
            state = ranks[0].state_dict()  # checkpoint after 5 steps; 4 more are lost
    for x in ranks:
        x.close()
    one = _loader(loc, led, batch_size=8, world_size=1, rank=0)
    one.load_state_dict(state)
    for _batch in one:
        pass
    one.close()
    report = audit(led)
    assert report.reproducible, report.to_json()
    (res,) = report.check("resumes").details["resumes"]
    assert (res["step"], res["rolled_back_steps"]) == (5, 8)  # 4 steps x 2 ranks
    assert report.check("coverage").details["epochs"][0]["duplicate_steps"] == []
