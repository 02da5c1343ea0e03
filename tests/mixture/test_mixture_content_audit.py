"""The audit proves the bytes a mixture run delivered (issue 17): every step's merged batch is
rebuilt from each source's verified shards and its digests compared with the ledger's.

Runs are made both where the loader reads every source through one reader (same schema:
``stoker.loader.read.mixture_union``) and where it reads source by source (one source's schema
differs); the audit always rebuilds source by source, so each path is checked against it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from mixture_helpers import make_source
from stoker.loader import DataLoader, LedgerOptions, ReadOptions, WorkerOptions
from stoker.loader.ledger.digest import CONTENT_ALGORITHM
from stoker.loader.ledger.writer import LedgerWriter, read_ledger
from stoker.loader.order.mixture import Mixture
from stoker.tools.audit import audit
from stoker.tools.audit.content import sampled
from stoker.tools.audit.html import render_html
from stoker.tools.cli import main

NAMES = ("web", "code", "books")
SHARDS = 8  # 4 + 2 + 2 shards in the three sources


def _mixture(root: Path, shared_reader: bool) -> Mixture:
    """Three sources (97, 40, 13 samples); ``shared_reader=False``: ``code``'s schema differs
    (``x`` not nullable), so the loader reads source by source."""
    make_source(root / "web", [20, 31, 17, 29], salt=0)
    make_source(root / "code", [16, 24], salt=1, nullable=shared_reader)
    make_source(root / "books", [6, 7], salt=2)
    return Mixture({n: str(root / n) for n in NAMES}, {"web": 2, "code": 3, "books": 1})


def _run(mix: Mixture, ledger: Path, epochs: int = 2, ids: bool = False, **kw) -> list[dict]:
    """Iterate ``epochs`` epochs with a ledger; the batches' ``source`` and ``id``, copied.
    Row-major records go to a directory of this run's own (records built while a shard was
    swapped would be served to any later run of the same bytes)."""
    read = dataclasses.replace(kw.pop("read", ReadOptions()), records_dir=ledger.parent / "records")
    dl = DataLoader(mix, batch_size=16, shuffle=True, seed=31,
                    ledger=LedgerOptions(ledger, ids=ids), read=read, **kw)
    out = []
    for e in range(epochs):
        dl.set_epoch(e)
        out += [{"source": b["source"].clone(), "id": b["id"].clone()} for b in dl]
    dl.close()
    return out


def _swap_one_value(shard: Path, row: int) -> bytes:
    """Rewrite ``shard`` with ``x`` of one row changed (same size, same schema); returns the
    original bytes."""
    original = shard.read_bytes()
    reader = pa.ipc.open_file(pa.py_buffer(original))
    table = reader.read_all()
    chunk = len(reader.get_batch(0))
    i = table.schema.get_field_index("x")
    x = table.column("x").to_numpy().copy()
    x[row] += 1000.0
    table = table.set_column(i, table.schema.field(i), pa.array(x, table.schema.field(i).type))
    with pa.OSFile(str(shard), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        for b in table.to_batches(max_chunksize=chunk):
            w.write_batch(b)
    assert shard.stat().st_size == len(original)
    return original


@pytest.mark.parametrize("shared_reader", [True, False], ids=["one-reader", "per-source"])
@pytest.mark.parametrize("workers", [0, 2])
def test_clean_mixture_run_passes_the_content_check(tmp_path: Path, shared_reader: bool,
                                                    workers: int) -> None:
    mix = _mixture(tmp_path / "src", shared_reader)
    extra = dict(num_workers=workers, workers=WorkerOptions(mode="process")) if workers else {}
    batches = _run(mix, tmp_path / "r.ledger", read=ReadOptions(features=["x"]), **extra)
    seg = read_ledger(tmp_path / "r.ledger").segments[0]
    assert seg.content_columns == ["features", "id", "seq", "name", "source"]
    assert seg.header["content"]["read"]["features"] == ["x"]
    report = audit(tmp_path / "r.ledger")
    content = report.check("content")
    assert content.status == "pass", content.details
    assert content.details["steps_checked"] == content.details["steps_recorded"] \
        == len(batches) == 2 * 10
    assert content.details["shards_verified"] == SHARDS
    assert report.exit_code == 0, report.to_json()


@pytest.mark.parametrize("shared_reader", [True, False], ids=["one-reader", "per-source"])
def test_one_wrong_value_from_one_source_fails_naming_step_rank_column(
        tmp_path: Path, shared_reader: bool, capsys) -> None:
    mix = _mixture(tmp_path / "src", shared_reader)
    web = mix.manifests[0]
    shard = Path(web.root) / web.shards[2].path  # web's samples 51..67
    original = _swap_one_value(shard, row=4)  # the node serves x+1000 for web sample 55
    batches = _run(mix, tmp_path / "r.ledger", epochs=1)
    shard.write_bytes(original)  # the sources are intact again: only the run saw other bytes
    wrong = [i for i, b in enumerate(batches)
             if (0, 55) in zip(b["source"].tolist(), b["id"].tolist())]
    assert len(wrong) == 1
    code = main(["audit", str(tmp_path / "r.ledger"), "--json", str(tmp_path / "a.json"),
                 "-o", str(tmp_path / "a.html")])
    assert code == 1
    assert f"first at epoch 0 step {wrong[0]} rank 0 column 'x'" in capsys.readouterr().out
    report = audit(tmp_path / "r.ledger")
    statuses = {c.name: c.status for c in report.checks}
    assert statuses["replay"] == "pass" and statuses["integrity"] == "pass"
    assert statuses["sources"] == "pass" and statuses["content"] == "fail"
    details = report.check("content").details
    first = details["first_mismatch"]
    assert (first["epoch"], first["step"], first["rank"], first["columns"]) == \
        (0, wrong[0], 0, ["x"])
    expected = {NAMES[s]: n for s, n in enumerate(np.bincount(
        batches[wrong[0]]["source"].numpy(), minlength=3).tolist()) if n}
    assert first["sources"] == expected
    assert details["mismatched"] == 1 and details["steps_checked"] == len(batches)
    html = (tmp_path / "a.html").read_text()
    assert 'id="content"' in html and "steps checked" in html and "mismatches" in html


def test_sampling_checks_a_deterministic_subset_of_a_mixture_run(tmp_path: Path,
                                                                  capsys) -> None:
    mix = _mixture(tmp_path / "src", True)
    _run(mix, tmp_path / "r.ledger", epochs=3)
    steps = read_ledger(tmp_path / "r.ledger").segments[0].steps
    picked = sum(sampled(int(r["epoch"]), int(r["step"]), int(r["rank"]), 0.3) for r in steps)
    assert 0 < picked < len(steps) == 30
    a = audit(tmp_path / "r.ledger", sample=0.3).check("content")
    assert a.status == "pass" and a.details["steps_recorded"] == 30
    assert a.details["steps_checked"] == picked and a.details["sample"] == 0.3
    assert "(sample 0.3 of 30 recorded)" in a.summary
    assert main(["audit", str(tmp_path / "r.ledger"), "--sample", "0.3", "-o",
                 str(tmp_path / "a.html")]) == 0
    capsys.readouterr()
    html = render_html(audit(tmp_path / "r.ledger", sample=0.3))
    assert f"all {picked} steps checked delivered" in html
    assert html.index('href="#replay"') < html.index('href="#content"') \
        < html.index('href="#sources"')


def test_a_damaged_source_fails_the_mixture_content_check(tmp_path: Path) -> None:
    mix = _mixture(tmp_path / "src", True)
    _run(mix, tmp_path / "r.ledger", epochs=1)
    books = mix.manifests[2]
    _swap_one_value(Path(books.root) / books.shards[1].path, row=0)  # damaged after the run
    report = audit(tmp_path / "r.ledger")
    content = report.check("content")
    assert content.status == "fail" and "source of truth is damaged" in content.summary
    assert report.check("integrity").status == "fail"


def test_a_mixture_ledger_without_read_options_skips_the_content_check(tmp_path: Path) -> None:
    """Ledgers of stokers before this check digested each merged batch as one value and
    recorded no read options: nothing to rebuild with, so the check says so (the replay
    still proves the ids)."""
    mix = _mixture(tmp_path / "src", True)
    _run(mix, tmp_path / "new.ledger", epochs=1, ids=True)
    seg = read_ledger(tmp_path / "new.ledger").segments[0]
    head = dict(seg.header, content={"algorithm": CONTENT_ALGORITHM, "columns": ["batch"],
                                     "read": None})
    step_ids = np.split(seg.ids, np.cumsum(seg.steps["count"])[:-1])
    with LedgerWriter(tmp_path / "old.ledger", head, ids=True) as w:
        for rec, ids in zip(seg.steps, step_ids):
            w.step(int(rec["epoch"]), int(rec["step"]), int(rec["rank"]), ids, 0.0, 0.0,
                   content=[1])
    report = audit(tmp_path / "old.ledger")
    content = report.check("content")
    assert content.status == "skip" and "without the read options" in content.summary
    assert report.check("replay").status == "pass" and report.reproducible


def test_moved_sources_are_rebuilt_through_a_mixture_file(tmp_path: Path) -> None:
    """``--dataset mixture.json`` names where the sources live now (remote sources: local
    copies); the rebuild reads and verifies those."""
    mix = _mixture(tmp_path / "src", False)
    _run(mix, tmp_path / "r.ledger", epochs=1)
    shutil.move(tmp_path / "src", tmp_path / "moved")
    assert audit(tmp_path / "r.ledger").check("content").status == "skip"
    spec = tmp_path / "moved" / "mixture.json"
    spec.write_text(json.dumps({"sources": {n: n for n in NAMES},
                                "weights": {"web": 2, "code": 3, "books": 1}}))
    content = audit(tmp_path / "r.ledger", dataset=str(spec)).check("content")
    assert content.status == "pass" and content.details["dataset"] == str(spec)
    assert content.details["steps_checked"] == 10 and content.details["shards_verified"] == SHARDS


def test_a_mixture_run_with_its_own_sampler_is_not_replayed(tmp_path: Path) -> None:
    """As for one dataset: a sampler's order is not the mixture's, so neither the ids nor the
    bytes can be rebuilt from the ledger (they would all differ); the audit says so."""
    mix = _mixture(tmp_path / "src", True)
    dl = DataLoader(mix, batch_size=16, sampler=list(range(mix.num_samples))[::-1],
                    ledger=LedgerOptions(tmp_path / "r.ledger"),
                    read=ReadOptions(records_dir=tmp_path / "records"))
    assert sum(1 for _ in dl) == 10
    dl.close()
    report = audit(tmp_path / "r.ledger")
    statuses = {c.name: c.status for c in report.checks}
    assert statuses["replay"] == statuses["content"] == statuses["sources"] == "skip"
    assert "its own sampler" in report.check("content").summary and report.reproducible
