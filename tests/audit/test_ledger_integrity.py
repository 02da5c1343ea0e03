"""A ledger knows its history (issue 14, hole 2).

A restart over a ledger (a new loader on the same path, ``load_state_dict`` forgotten) is
refused by the loader and, written by any other writer, fails the audit; a second live writer
is refused by a lock that a killed holder releases; the audit names every gap and duplicate.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "loader"))

from loader_helpers import make_dataset  # noqa: E402

from stoker.loader import DataLoader, ReadOptions  # noqa: E402
from stoker.loader.ledger.writer import LedgerError, LedgerWriter  # noqa: E402
from stoker.tools.audit import audit  # noqa: E402

ROWS = [90, 80, 100, 70]  # 340 samples: 34 steps of 10


def _loader(root: Path, ledger: Path, **kw) -> DataLoader:
    return DataLoader(root, batch_size=10, shuffle=True, seed=11, ledger=ledger,
                      read=ReadOptions(records_dir=ledger.parent / "records"),
                      **kw)


def _consume(dl: DataLoader, n: int) -> None:
    it = iter(dl)
    for _ in range(n):
        next(it)


@pytest.fixture()
def data(tmp_path: Path) -> Path:
    make_dataset(tmp_path / "d", ROWS)
    return tmp_path / "d"


def test_restart_over_a_ledger_without_load_state_dict_is_refused(data: Path,
                                                                   tmp_path: Path) -> None:
    ledger = tmp_path / "run.ledger"
    first = _loader(data, ledger)
    _consume(first, 17)
    first.close()
    again = _loader(data, ledger)  # the same script started again, load_state_dict forgotten
    with pytest.raises(LedgerError, match=r"up to epoch 0 step 16.*load_state_dict"):
        next(iter(again))
    again.close()
    report = audit(ledger, dataset=str(data))
    assert report.reproducible  # the refused loader recorded nothing
    assert report.check("stream").details["steps"] == 17


def test_resume_from_a_state_and_a_new_loader_per_epoch_are_allowed(data: Path,
                                                                      tmp_path: Path) -> None:
    ledger = tmp_path / "run.ledger"
    first = _loader(data, ledger)
    _consume(first, 17)
    state = first.state_dict()
    first.close()
    resumed = _loader(data, ledger)
    resumed.load_state_dict(state)
    assert len(list(resumed)) == 34 - 17
    resumed.close()
    following = _loader(data, ledger)  # epoch 1 in a loader of its own
    following.set_epoch(1)
    assert len(list(following)) == 34
    following.close()
    report = audit(ledger, dataset=str(data))
    assert report.reproducible, report.to_json()
    assert report.check("resumes").details["restarts"] == 0


def test_another_run_on_the_same_ledger_is_refused(data: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "run.ledger"
    first = _loader(data, ledger)
    _consume(first, 3)
    first.close()
    other = DataLoader(data, batch_size=10, shuffle=True, seed=12, ledger=ledger)
    other.load_state_dict({**first.state_dict(), "seed": 12})
    with pytest.raises(LedgerError, match=r"another run \(seed 11"):
        next(iter(other))
    other.close()


def test_a_restart_written_by_another_writer_fails_the_audit(data: Path, tmp_path: Path) -> None:
    """A ledger written without the loader's check (an older stoker, a hand-made writer): the
    second segment starts over at step 0 after 17 steps; the audit used to call it a fresh
    start, roll the 17 back and pass."""
    ledger = tmp_path / "run.ledger"
    first = _loader(data, ledger)
    _consume(first, 17)
    first.close()
    (tmp_path / "copy").mkdir()
    replay = _loader(data, tmp_path / "copy" / "run.ledger")
    _consume(replay, 34)
    replay.close()
    from stoker.loader.ledger.writer import read_ledger

    seg = read_ledger(tmp_path / "copy" / "run.ledger").segments[0]
    with LedgerWriter(ledger, {k: v for k, v in seg.header.items()
                               if k not in ("content",)}) as w:
        for rec in seg.steps[:20]:
            w.step(int(rec["epoch"]), int(rec["step"]), 0,
                   __import__("numpy").arange(int(rec["count"])), 0.0, 0.0)
    report = audit(ledger, dataset=str(data))
    resumes = report.check("resumes")
    assert resumes.status == "fail" and "restart(s) over the ledger" in resumes.summary
    assert resumes.details["restarts"] == 1
    assert resumes.details["resumes"][0]["rolled_back_steps"] == 17
    assert report.exit_code == 1


def test_a_second_live_writer_is_refused(data: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "run.ledger"
    first = _loader(data, ledger)
    _consume(first, 2)
    second = _loader(data, ledger)
    second.load_state_dict(first.state_dict())
    with pytest.raises(LedgerError, match=r"another loader is writing this ledger now \(pid "
                                          rf"{os.getpid()}"):
        next(iter(second))
    second.close()
    _consume(first, 1)  # the first writer is untouched
    first.close()
    third = _loader(data, ledger)  # and once it is closed, the ledger is free again
    third.load_state_dict(first.state_dict())
    next(iter(third))
    third.close()


def test_the_lock_dies_with_a_killed_holder(tmp_path: Path) -> None:
    ledger = tmp_path / "run.ledger"
    code = textwrap.dedent(f"""
        import sys, time
        from stoker.loader.ledger.writer import LedgerWriter
        w = LedgerWriter({str(ledger)!r}, {{"seed": 1}})
        print("locked", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(LedgerError, match=f"pid {proc.pid}"):
            LedgerWriter(ledger, {"seed": 1})
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with LedgerWriter(ledger, {"seed": 1}) as w:  # no stale lock after the kill
        assert not w.closed


def test_the_audit_names_every_gap_and_duplicate(tmp_path: Path, dataset, kit) -> None:
    m, loc = dataset
    head = kit.header(m, loc)
    spe = kit.steps_per_epoch(head)
    # epoch 0 stops after step 9 (steps 10.. skipped), epoch 1 consumes 2-4 twice, and skips 8
    positions = [(0, s) for s in range(10)] + [(1, s) for s in range(5)] + \
        [(1, s) for s in range(2, 8)] + [(1, s) for s in range(9, spe)]
    path = tmp_path / "gappy.ledger"
    with LedgerWriter(path, head) as w:
        kit.write_steps(w, m, head, positions)
    report = audit(path)
    assert report.exit_code == 1
    ep0, ep1 = report.check("coverage").details["epochs"]
    assert ep0["status"] == "fail" and ep0["missing_ranges"] == [[10, spe - 1]]
    assert "skipped: never consumed before epoch 1" in ep0["verdict"]
    assert ep1["duplicate_steps"] == [2, 3, 4] and ep1["missing_ranges"] == [[8, 8]]
