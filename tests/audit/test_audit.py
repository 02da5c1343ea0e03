"""``stoker audit``: a clean run passes; every injected fault is found and named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from stoker.loader.ledger.writer import LedgerWriter
from stoker.loader.ledger.format import FRAME_STEPS, iter_frames
from stoker.tools.audit import audit
from stoker.tools.cli import main


def _statuses(report) -> dict[str, str]:
    return {c.name: c.status for c in report.checks}


@pytest.mark.parametrize("ids", [False, True])
def test_clean_run_passes_with_exit_0(tmp_path: Path, dataset, kit, ids: bool, capsys) -> None:
    m, loc = dataset
    run = kit.write_run(tmp_path / "runs/a.ledger", m, loc, ids=ids)
    out_json = tmp_path / "out/a.json"
    assert main(["audit", str(run), "--json", str(out_json), "-o", str(tmp_path / "a.html")]) == 0
    text = capsys.readouterr().out
    assert "result: REPRODUCIBLE" in text and "replay      PASS  all 28 steps" in text
    doc = json.loads(out_json.read_text())
    assert doc["reproducible"] is True
    assert {k: v["status"] for k, v in doc["checks"].items()} == {
        "identity": "pass", "stream": "pass", "resumes": "pass", "events": "pass", "replay": "pass",
        "content": "skip", "coverage": "pass", "integrity": "pass", "stall": "info"}
    epochs = doc["checks"]["coverage"]["details"]["epochs"]
    assert [(e["epoch"], e["complete"], e["method"]) for e in epochs] == [
        (0, True, "ids" if ids else "replay"), (1, True, "ids" if ids else "replay")]


def test_multi_rank_directory_and_elastic_comparison(tmp_path: Path, dataset, kit) -> None:
    m, loc = dataset
    kit.write_run(f"{tmp_path}/w2/", m, loc, world_size=2)
    kit.write_run(tmp_path / "w1.ledger", m, loc, ids=True)
    assert sorted(p.name for p in (tmp_path / "w2").glob("*.ledger")) == ["rank00000.ledger",
                                                                         "rank00001.ledger"]
    report = audit(tmp_path / "w2", tmp_path / "w1.ledger")
    assert report.reproducible, report.to_json()
    assert report.check("comparison").details["common_steps"] == 28


def _find(report, name: str) -> dict:
    return report.check(name).details


def test_injected_duplicate_is_flagged(tmp_path: Path, dataset, kit) -> None:
    m, loc = dataset
    head = kit.header(m, loc)
    victim = int(kit.expected_ids(m, head, 0, 0, 0)[0])

    def dup(epoch, step, rank, ids):
        if (epoch, step) == (0, 5):
            ids[2] = victim
        return ids

    report = audit(kit.write_run(tmp_path / "a.ledger", m, loc, ids=True, mutate=dup))
    assert report.exit_code == 1
    first = _find(report, "replay")["first_mismatch"]
    assert (first["epoch"], first["step"], first["rank"]) == (0, 5, 0)
    assert first["unexpected_ids"] == [victim]
    ep0 = _find(report, "coverage")["epochs"][0]
    assert ep0["status"] == "fail" and ep0["duplicate_ids"] == [victim]
    assert len(ep0["missing_ids"]) == 1
    assert _find(report, "coverage")["epochs"][1]["status"] == "pass"


def test_skipped_sample_is_flagged_without_ids(tmp_path: Path, dataset, kit) -> None:
    m, loc = dataset
    report = audit(kit.write_run(
        tmp_path / "a.ledger", m, loc,
        mutate=lambda e, s, r, ids: ids[:-1] if (e, s) == (1, 2) else ids))
    assert report.exit_code == 1
    first = _find(report, "replay")["first_mismatch"]
    assert (first["epoch"], first["step"]) == (1, 2)
    assert (first["expected_count"], first["consumed_count"]) == (8, 7)
    assert _statuses(report)["coverage"] == "fail"


def test_two_swapped_samples_are_flagged(tmp_path: Path, dataset, kit) -> None:
    m, loc = dataset
    head = kit.header(m, loc)
    a, b = kit.expected_ids(m, head, 0, 3, 0), kit.expected_ids(m, head, 0, 9, 0)

    def swap(epoch, step, rank, ids):
        if epoch == 0 and step == 3:
            ids[0] = b[1]
        if epoch == 0 and step == 9:
            ids[1] = a[0]
        return ids

    report = audit(kit.write_run(tmp_path / "a.ledger", m, loc, ids=True, mutate=swap))
    assert report.exit_code == 1
    replay = _find(report, "replay")
    assert replay["mismatched"] == 2 and replay["first_mismatch"]["step"] == 3
    assert replay["first_mismatch"]["differing_positions"] == [0]
    # every sample was still consumed exactly once: only the replay can catch a swap
    assert _find(report, "coverage")["epochs"][0]["duplicate_ids"] == []


def test_modified_dataset_fails_replay(tmp_path: Path, dataset, kit) -> None:
    m, loc = dataset
    run = kit.write_run(tmp_path / "a.ledger", m, loc)
    kit.make_dataset(Path(loc), offset=0.5)  # same layout, different bytes, new fingerprint
    report = audit(run)
    assert report.exit_code == 1
    assert _statuses(report)["replay"] == "fail"
    assert "the data changed" in report.check("replay").summary


def test_tampered_shard_fails_integrity(tmp_path: Path, dataset, kit) -> None:
    m, loc = dataset
    run = kit.write_run(tmp_path / "a.ledger", m, loc)
    shard = Path(loc) / m.shards[2].path
    data = bytearray(shard.read_bytes())
    data[-20] ^= 1
    shard.write_bytes(bytes(data))
    report = audit(run)
    assert _statuses(report)["integrity"] == "fail" and report.exit_code == 1
    assert _statuses(audit(run, verify=False))["integrity"] == "skip"


def test_dataset_override_and_unreachable_dataset(tmp_path: Path, dataset, kit) -> None:
    m, loc = dataset
    run = kit.write_run(tmp_path / "a.ledger", m, str(tmp_path / "moved-away"))
    report = audit(run)
    assert _statuses(report)["replay"] == "skip" and "--dataset" in report.check("replay").summary
    assert audit(run, dataset=loc).check("replay").status == "pass"


def _resumed(tmp_path: Path, m, loc, kit, first: int, target: int, recorded: int,
             event: bool = True) -> Path:
    """Steps [0, first) of epoch 0, then a new segment resumed at ``target`` that records
    from ``recorded`` to the end of epoch 1."""
    path = tmp_path / "r.ledger"
    head = kit.header(m, loc)
    spe = kit.steps_per_epoch(head)
    with LedgerWriter(path, head) as w:
        kit.write_steps(w, m, head, [(0, s) for s in range(first)])
    with LedgerWriter(path, head) as w:
        if event:
            w.event("resume", state={"epoch": 0, "step": target, "seed": 7})
        kit.write_steps(w, m, head, [(0, s) for s in range(recorded, spe)] +
                        [(1, s) for s in range(spe)])
    return path


def test_exact_resume_after_rollback_passes(tmp_path: Path, dataset, kit) -> None:
    m, loc = dataset
    report = audit(_resumed(tmp_path, m, loc, kit, first=10, target=6, recorded=6))
    assert report.reproducible, report.to_json()
    (res,) = _find(report, "resumes")["resumes"]
    assert (res["epoch"], res["step"], res["rolled_back_steps"], res["exact"]) == (0, 6, 4, True)


def test_resume_with_a_gap_is_flagged(tmp_path: Path, dataset, kit) -> None:
    m, loc = dataset
    report = audit(_resumed(tmp_path, m, loc, kit, first=10, target=12, recorded=12))
    assert report.exit_code == 1
    (res,) = _find(report, "resumes")["resumes"]
    assert res["gap"] == "epoch 0 step 10 up to (not including) epoch 0 step 12"
    ep0 = _find(report, "coverage")["epochs"][0]
    assert ep0["status"] == "fail" and ep0["missing_steps"] == [10, 11]


def test_resume_that_does_not_continue_where_it_said(tmp_path: Path, dataset, kit) -> None:
    m, loc = dataset
    report = audit(_resumed(tmp_path, m, loc, kit, first=10, target=10, recorded=11))
    assert _statuses(report)["resumes"] == "fail"
    assert _find(report, "resumes")["resumes"][0]["next_recorded"] == [0, 11]


def test_truncated_ledger_is_reported_not_fatal(tmp_path: Path, dataset, kit) -> None:
    m, loc = dataset
    path = tmp_path / "a.ledger"
    head = kit.header(m, loc)
    with LedgerWriter(path, head, flush_steps=4) as w:
        kit.write_steps(w, m, head, kit.epoch_positions(head, range(2)))
    data = path.read_bytes()
    last = [f for f in iter_frames(data) if f[2] == FRAME_STEPS][-1]
    path.write_bytes(data[:(last[0] + last[1]) // 2])  # a crash while writing the last frame
    report = audit(path)
    stream = report.check("stream")
    assert stream.status == "warn" and "cut short by a crash" in stream.summary
    assert stream.details["truncated"][0]["readable_steps"] == 24
    epochs = _find(report, "coverage")["epochs"]
    assert epochs[1]["complete"] is False and epochs[1]["status"] == "pass"
    assert "partial (10/14 steps)" in epochs[1]["verdict"]
    assert report.exit_code == 0


def test_two_runs_diverging_are_compared(tmp_path: Path, dataset, kit) -> None:
    m, loc = dataset
    a = kit.write_run(tmp_path / "a.ledger", m, loc, ids=True)
    b = kit.write_run(tmp_path / "b.ledger", m, loc, ids=True,
                      mutate=lambda e, s, r, ids: ids[::-1] if (e, s) == (1, 4) else ids)
    report = audit(a, b)
    comp = report.check("comparison")
    assert comp.status == "fail"
    div = comp.details["first_divergence"]
    assert (div["epoch"], div["step"]) == (1, 4)
    assert div["second_ids"] == div["first_ids"][::-1]
    seeded = kit.write_run(tmp_path / "c.ledger", m, loc, seed=8)
    comp = audit(a, seeded).check("comparison")
    assert comp.details["header_differences"]["seed"] == [7, 8]
    assert comp.details["first_divergence"]["step"] == 0
    assert audit(a, kit.write_run(tmp_path / "d.ledger", m, loc)).reproducible


def test_generic_torch_dataset_is_replayed_from_its_length(tmp_path: Path, kit) -> None:
    from stoker.loader.order.epoch import EpochOrder, OrderOptions
    from stoker.loader.order.schedule import BatchPlan, rank_batch_ids
    from stoker.loader.read.torch_dataset import virtual_shard_rows

    n = 2500
    head = {"dataset": "MyDataset", "fingerprint": "ab" * 16, "num_samples": n, "seed": 1,
            "order": OrderOptions().to_dict(), "global_batch": 100, "world_size": 1, "rank": 0,
            "drop_last": False, "kind": "torch", "dataset_len": n, "mode": "order"}
    order = EpochOrder(virtual_shard_rows(n), head["fingerprint"], 1, 0, OrderOptions())
    plan = BatchPlan(n, 100)
    with LedgerWriter(tmp_path / "t.ledger", head) as w:
        for s in range(plan.steps_per_epoch):
            w.step(0, s, 0, rank_batch_ids(order, plan, s), 0.0, 0.01)
    report = audit(tmp_path / "t.ledger")
    assert report.reproducible and report.check("replay").status == "pass"
    assert report.check("integrity").status == "skip"


def test_bad_usage_exits_2(tmp_path: Path, capsys) -> None:
    assert main(["audit", str(tmp_path / "missing.ledger")]) == 2
    assert "no ledger found" in capsys.readouterr().err
    assert main(["audit"]) == 2
    (tmp_path / "notes.ledger").write_text("not a ledger")
    assert main(["audit", str(tmp_path / "notes.ledger")]) == 2
    assert "not a stoker ledger" in capsys.readouterr().err


def test_reports_never_contain_credentials(tmp_path: Path, dataset, kit) -> None:
    m, loc = dataset
    secret = "hunter2-SECRET-c0ffee"
    head = kit.header(m, f"s3://me:{secret}@bucket/data?sig={secret}")
    head["storage_options"] = {"secret": secret}
    with LedgerWriter(tmp_path / "a.ledger", head) as w:
        kit.write_steps(w, m, head, [(0, 0), (0, 1)])
    out = tmp_path / "r"
    main(["audit", str(tmp_path / "a.ledger"), "-o", f"{out}.html", "--json", f"{out}.json", "-q"])
    for f in (tmp_path / "a.ledger", Path(f"{out}.html"), Path(f"{out}.json")):
        assert secret.encode() not in f.read_bytes()
    assert "s3://bucket/data" in Path(f"{out}.json").read_text()


def test_events_are_listed_and_skips_warned(tmp_path: Path, dataset, kit) -> None:
    m, loc = dataset
    head = kit.header(m, loc)
    with LedgerWriter(tmp_path / "a.ledger", head) as w:
        kit.write_steps(w, m, head, [(0, 0), (0, 1)])
        w.event("retry", shard="shards/00001.arrow", attempt=1)
        w.event("quarantine", shard="shards/00001.arrow")
    report = audit(tmp_path / "a.ledger")
    ev = report.check("events")
    assert ev.status == "info" and ev.details["counts"] == {"retry": 1, "quarantine": 1}
    assert ev.details["events"][0]["at"] == 2 and report.reproducible
    with LedgerWriter(tmp_path / "a.ledger", head) as w:
        w.event("skip", sample=5)
    assert audit(tmp_path / "a.ledger").check("events").status == "warn"


def test_step_outside_the_epoch_is_a_replay_failure(tmp_path: Path, dataset, kit) -> None:
    m, loc = dataset
    head = kit.header(m, loc)
    with LedgerWriter(tmp_path / "a.ledger", head) as w:
        kit.write_steps(w, m, head, [(0, 0)])
        w.step(0, 99, 0, np.arange(8), 0.0, 0.01)
    replay = audit(tmp_path / "a.ledger").check("replay")
    assert replay.status == "fail" and replay.details["mismatched"] == 1
    assert replay.details["first_mismatch"]["step"] == 99
    assert "IndexError" in replay.details["first_mismatch"]["error"]


def test_comparison_across_world_sizes_needs_the_replay(tmp_path: Path, dataset, kit) -> None:
    m, loc = dataset
    a = kit.write_run(f"{tmp_path}/w2/", m, loc, world_size=2)
    b = kit.write_run(tmp_path / "w1.ledger", m, loc)
    assert audit(a, b).check("comparison").status == "pass"
    moved = audit(a, b, dataset=str(tmp_path / "gone")).check("comparison")
    assert moved.status == "warn" and moved.details["incomparable_steps"] == 28


def test_steps_recorded_twice_without_a_resume(tmp_path: Path, dataset, kit) -> None:
    m, loc = dataset
    head = kit.header(m, loc)
    spe = kit.steps_per_epoch(head)
    with LedgerWriter(tmp_path / "a.ledger", head) as w:
        kit.write_steps(w, m, head, [(0, s) for s in range(6)] + [(0, s) for s in range(3, spe)])
    report = audit(tmp_path / "a.ledger")
    assert report.check("stream").details["discontinuities"][0]["from"] == [0, 5]
    assert report.check("stream").status == "fail"
    ep0 = report.check("coverage").details["epochs"][0]
    assert ep0["duplicate_steps"] == [3, 4, 5] and ep0["status"] == "fail"
    assert report.check("replay").status == "pass"  # each step alone is what the order says


def test_minimal_or_empty_segments_do_not_break_the_audit(tmp_path: Path, dataset, kit) -> None:
    m, loc = dataset
    head = kit.header(m, loc)
    path = kit.write_run(tmp_path / "a.ledger", m, loc, epochs=1)
    LedgerWriter(path, head).close()  # a restart that crashed before its first step
    report = audit(path)
    assert report.reproducible and report.check("resumes").details["resumes"] == []
    with LedgerWriter(tmp_path / "bare.ledger", {"seed": 1}) as w:
        w.step(0, 0, 0, np.arange(4), 0.0, 0.01)
    bare = audit(tmp_path / "bare.ledger")
    assert bare.check("identity").status == "fail"
    assert "num_samples" in bare.check("identity").details["missing_keys"]
    (tmp_path / "cut.ledger").write_bytes(b"STOK")  # killed while writing the magic
    assert audit(tmp_path / "cut.ledger").check("stream").status == "warn"
