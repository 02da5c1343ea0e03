"""The audit proves the bytes delivered, not only the ids (issue 14, hole 1).

A run is recorded with its content digests; ``stoker audit RUN --dataset DATASET`` rebuilds
every step's batch from the manifest's shards (re-hashed first) and compares. A node that
served other bytes for the right ids (a shard swapped during the run) is caught, naming the
first wrong step, rank and column; one changed value is enough. Derived row-major records
rewritten with a matching checksum are no longer served at all: the loader checks them against
the shard first (tests/fastpath/test_record_check.py has the sampled cases). A clean run, with
every column kind the loader produces, passes.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "loader"))

from loader_helpers import make_dataset  # noqa: E402

from stoker.loader import DataLoader, ReadOptions  # noqa: E402
from stoker.loader.ledger.writer import read_ledger  # noqa: E402
from stoker.tools.audit import audit  # noqa: E402
from stoker.tools.audit.html import render_html  # noqa: E402
from stoker.tools.cli import main  # noqa: E402

ROWS = [40, 35, 50, 33]


def _run(root: Path, ledger: Path, epochs: int = 1, **kw) -> list[dict]:
    """Iterate ``epochs`` epochs with a ledger; the batches' values, copied. Row-major records
    go to a directory of this test's own: records built while a shard was swapped are named
    after the manifest's hash and would be served to any later run of the same bytes."""
    kw["read"] = dataclasses.replace(kw.get("read", ReadOptions()),
                                     records_dir=ledger.parent / "records")
    kw.setdefault("shuffle", True)
    dl = DataLoader(root, batch_size=16, seed=5, ledger=ledger, **kw)
    out = []
    for e in range(epochs):
        dl.set_epoch(e)
        out += [{k: (v.clone() if hasattr(v, "clone") else list(v)) for k, v in b.items()}
                for b in dl]
    dl.close()
    return out


def _swap_one_value(shard: Path, row: int) -> bytes:
    """Rewrite ``shard`` with ``x`` of one row changed (same size); returns the original."""
    original = shard.read_bytes()
    table = pa.ipc.open_file(pa.py_buffer(original)).read_all()
    x = table.column("x").to_numpy().copy()
    x[row] += 1000.0
    table = table.set_column(table.schema.get_field_index("x"), "x", pa.array(x))
    batches = [len(b) for b in pa.ipc.open_file(pa.py_buffer(original)).read_all().to_batches()]
    with pa.OSFile(str(shard), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        for b in table.to_batches(max_chunksize=batches[0]):
            w.write_batch(b)
    assert shard.stat().st_size == len(original)
    return original


@pytest.mark.parametrize("workers", [0, 2])
def test_clean_run_passes_the_content_check(tmp_path: Path, workers: int) -> None:
    make_dataset(tmp_path / "d", ROWS)
    # every kind of output: a stacked matrix, categoricals, a ragged list (+ lengths), strings
    _run(tmp_path / "d", tmp_path / "r.ledger", epochs=2, num_workers=workers,
         read=ReadOptions(features=["x"], categoricals=["y"]))
    report = audit(tmp_path / "r.ledger", dataset=str(tmp_path / "d"))
    content = report.check("content")
    assert content.status == "pass", content.details
    assert content.details["steps_checked"] == content.details["steps_recorded"] == 20
    assert report.exit_code == 0
    seg = read_ledger(tmp_path / "r.ledger").segments[0]
    assert seg.content_columns == ["features", "categoricals", "id", "seq", "name"]
    assert seg.content.shape == (20, 5)


def test_one_wrong_value_served_during_the_run_fails_naming_step_rank_column(
        tmp_path: Path, capsys) -> None:
    m = make_dataset(tmp_path / "d", ROWS)
    shard = tmp_path / "d" / m.shards[2].path
    original = _swap_one_value(shard, row=7)  # the node serves x+1000 for sample 75+7 = 82
    batches = _run(tmp_path / "d", tmp_path / "r.ledger")
    shard.write_bytes(original)  # the dataset is intact again: only the run saw other bytes
    wrong = [i for i, b in enumerate(batches) if 82 in b["id"].tolist()]
    assert len(wrong) == 1
    code = main(["audit", str(tmp_path / "r.ledger"), "--dataset", str(tmp_path / "d"),
                 "--json", str(tmp_path / "a.json"), "-o", str(tmp_path / "a.html")])
    assert code == 1
    out = capsys.readouterr().out
    assert f"first at epoch 0 step {wrong[0]} rank 0 column 'x'" in out
    report = audit(tmp_path / "r.ledger", dataset=str(tmp_path / "d"))
    statuses = {c.name: c.status for c in report.checks}
    assert statuses["replay"] == "pass" and statuses["integrity"] == "pass"
    first = report.check("content").details["first_mismatch"]
    assert (first["epoch"], first["step"], first["rank"], first["columns"]) == \
        (0, wrong[0], 0, ["x"])
    assert report.check("content").details["mismatched"] == 1
    html = (tmp_path / "a.html").read_text()
    assert 'id="content"' in html and "steps checked" in html and "mismatches" in html


def test_tampered_row_major_records_with_their_checksum_rewritten(tmp_path: Path) -> None:
    """The issue's case: derived records rewritten with a matching trailing checksum. The
    loader checks stored records against the shard before serving them
    (stoker.loader.fastpath.record_check): it serves the dataset's values, counts one
    ``records_mismatch`` fallback per tampered file (in stats and the ledger), and rebuilds the
    files; the audit of the run passes because what was delivered is right."""
    make_dataset(tmp_path / "d", ROWS)
    store = tmp_path / "records"
    # natural order reads through per-shard record files; shuffled reads stage rounds in
    # memory from the verified shards and leave no derived file to tamper with
    dl = DataLoader(tmp_path / "d", batch_size=16, shuffle=False, seed=5, columns=["id"],
                    read=ReadOptions(row_major=True, records_dir=store, features=["x"]))
    for _ in dl:
        pass
    dl._source.wait_row_major()
    dl.close()
    files = sorted(store.rglob("*.rec"))
    assert len(files) == len(ROWS), "records were not saved"
    originals = {f: f.read_bytes() for f in files}
    for f in files:  # flip the first record's bytes, then rewrite the file's own checksum
        data = bytearray(f.read_bytes())
        body = data[:-16]
        body[:8] = bytes(b ^ 0x5A for b in body[:8])
        f.write_bytes(bytes(body) + xxhash.xxh3_128_digest(bytes(body)))
    ledger = tmp_path / "r.ledger"
    dl = DataLoader(tmp_path / "d", batch_size=16, shuffle=False, seed=5, columns=["id"],
                    ledger=ledger,
                    read=ReadOptions(features=["x"], row_major=True, records_dir=store))
    batches = [{k: v.clone() for k, v in b.items()} for b in dl]
    dl._source.wait_row_major()
    dl.close()
    assert sum(len(b["id"]) for b in batches) == sum(ROWS)
    for b in batches:  # x is id / 2 in the dataset: not one tampered value was served
        assert np.array_equal(b["features"][:, 0].numpy(),
                              (b["id"].numpy() * 0.5).astype(np.float32)), b["id"][:4]
    assert dl.stats.fallbacks == {"records_mismatch": len(files)}
    events = [e for e in read_ledger(ledger).events if e["kind"] == "fallback"]
    assert [e["reason"] for e in events] == ["records_mismatch"] and "shard 0" in \
        events[0]["detail"]
    assert {f: f.read_bytes() for f in files} == originals  # rebuilt from the shards
    report = audit(ledger, dataset=str(tmp_path / "d"))
    assert report.check("replay").status == "pass"
    assert report.check("content").status == "pass"
    assert report.exit_code == 0


def test_sampling_checks_a_deterministic_share(tmp_path: Path) -> None:
    make_dataset(tmp_path / "d", ROWS)
    _run(tmp_path / "d", tmp_path / "r.ledger", epochs=3)
    a = audit(tmp_path / "r.ledger", dataset=str(tmp_path / "d"), sample=0.3).check("content")
    b = audit(tmp_path / "r.ledger", dataset=str(tmp_path / "d"), sample=0.3).check("content")
    assert a.status == "pass" and a.details["steps_recorded"] == 30
    assert 0 < a.details["steps_checked"] < 30
    assert a.details["steps_checked"] == b.details["steps_checked"]
    assert main(["audit", str(tmp_path / "r.ledger"), "--sample", "0"]) == 2
    assert main(["audit", str(tmp_path / "r.ledger"), "--sample", "1.5"]) == 2


def test_a_damaged_source_of_truth_fails_the_content_check(tmp_path: Path) -> None:
    m = make_dataset(tmp_path / "d", ROWS)
    _run(tmp_path / "d", tmp_path / "r.ledger")
    _swap_one_value(tmp_path / "d" / m.shards[1].path, row=0)  # damaged after the run
    report = audit(tmp_path / "r.ledger", dataset=str(tmp_path / "d"))
    content = report.check("content")
    assert content.status == "fail" and "source of truth is damaged" in content.summary
    assert report.check("integrity").status == "fail"


def test_html_report_shows_the_content_check_next_to_the_replay(tmp_path: Path) -> None:
    make_dataset(tmp_path / "d", ROWS)
    _run(tmp_path / "d", tmp_path / "r.ledger")
    html = render_html(audit(tmp_path / "r.ledger", dataset=str(tmp_path / "d")))
    replay_row, content_row = html.index('href="#replay"'), html.index('href="#content"')
    assert replay_row < content_row < html.index('href="#coverage"')
    assert "steps checked" in html and "all 10 steps checked delivered" in html
