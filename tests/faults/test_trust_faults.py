"""Issue 14's fault cases: tampered derived data, and a restart over a ledger.

18. Derived row-major records are rewritten with bytes flipped at a random place and their
    own trailing checksum recomputed (what a stale or buggy build leaves). A run reads with
    them and a ledger. The loader checks a stored file against the shard before serving it
    (the first and last rows and 64 random rows; every row of a shard that has no more): a
    tamper it sees is a counted ``records_mismatch`` fallback, the file is rebuilt and not one
    tampered value is served; a tamper outside the sampled rows is served, and then
    ``stoker audit --dataset`` fails naming the first wrong step. Run twice: with the default
    sample (how often the loader itself caught it is noted) and with every row checked.
19. A run consumes a random number of batches; a new loader on the same ledger without
    ``load_state_dict`` must be refused, and the ledger's audit must show exactly the steps
    consumed once; the same restart written by a writer that does not check (an older
    stoker) must fail the audit.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import xxhash

from fault_helpers import Figures, Stopwatch, make_dataset, trials

from stoker.loader import DataLoader, ReadOptions
from stoker.loader.fastpath import record_check
from stoker.loader.ledger.writer import LedgerError, LedgerWriter, read_ledger
from stoker.tools.audit import audit

TAMPERS = trials(2, 20)
RESTARTS = trials(2, 20)
KW = dict(batch_size=16, shuffle=True, seed=4)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("trust")
    make_dataset(root, [70, 90, 60, 80], batch_rows=16)
    return root


def _tamper(store: Path, rng: random.Random, stride: int,
            fields: list[tuple[int, int]]) -> tuple[Path, bytes, set[int]]:
    """Flip 8 bytes at a random place of one record file and rewrite its trailing checksum;
    returns the file, its original bytes and the rows whose served bytes (``fields``: byte
    ranges inside a record; the rest is padding) were changed."""
    files = sorted(store.rglob("*.rec"))
    assert files, "no records were saved"
    f = rng.choice(files)
    original = f.read_bytes()
    body = bytearray(original[:-16])
    at = rng.randrange(len(body))
    touched = set()
    for k in range(at, min(at + 8, len(body))):
        body[k] ^= 0xA5
        if any(lo <= k % stride < hi for lo, hi in fields):
            touched.add(k // stride)
    f.write_bytes(bytes(body) + xxhash.xxh3_128_digest(bytes(body)))
    return f, original, touched


@pytest.mark.parametrize("sample", ["default", "every row"])
@pytest.mark.timeout(300)
def test_tampered_derived_records_are_rebuilt_or_fail_the_audit(
        dataset: Path, tmp_path: Path, sample: str, monkeypatch: pytest.MonkeyPatch) -> None:
    figures = Figures("18 tampered derived records (checksum rewritten), "
                      f"{'sampled rows checked' if sample == 'default' else 'every row checked'}")
    if sample == "every row":
        monkeypatch.setattr(record_check, "SAMPLE_ROWS", 1000)
    rng = random.Random(18)
    for t in range(TAMPERS):
        figures.start()
        store = tmp_path / f"records{t}"
        warm = DataLoader(dataset, columns=["id", "x"],
                          read=ReadOptions(row_major=True, records_dir=store), **KW)
        list(warm)
        warm._source.wait_row_major()
        layout = warm._source._records.layout
        warm.close()
        victim, original, touched = _tamper(
            store, rng, layout.stride, [(f.offset, f.offset + f.nbytes) for f in layout.fields])
        ledger = tmp_path / f"run{t}.ledger"
        dl = DataLoader(dataset, columns=["id", "x"], ledger=ledger,
                        read=ReadOptions(row_major=True, records_dir=store), **KW)
        batches = [{k: v.clone() for k, v in b.items() if k in ("id", "x")} for b in dl]
        dl._source.wait_row_major()
        dl.close()
        wrong = [i for i, b in enumerate(batches)  # x is id / 2 in the dataset
                 if not np.array_equal(b["x"].numpy(), (b["id"].numpy() * 0.5).astype(np.float32))]
        caught = dl.stats.fallbacks.get("records_mismatch", 0)
        with Stopwatch() as sw:
            report = audit(ledger, dataset=str(dataset))
        content = report.check("content")
        if caught:  # the loader saw it: nothing tampered served, the file rebuilt
            assert touched and caught == 1 and not wrong, (touched, caught, wrong)
            assert victim.read_bytes() == original
            assert any(e.get("reason") == "records_mismatch" for e in read_ledger(ledger).events)
        else:  # padding only, or a row outside the sample: served, and the audit fails it
            assert sample == "default" or not touched, touched
            assert bool(wrong) == bool(touched), (touched, wrong)
        if wrong:
            assert report.exit_code == 1 and content.status == "fail", content.summary
            assert content.details["first_mismatch"]["step"] == wrong[0]
        else:
            assert content.status == "pass" and report.exit_code == 0, content.summary
        if touched:
            figures.notes["values tampered"] = figures.notes.get("values tampered", 0) + 1
            figures.notes["caught by the loader"] = \
                figures.notes.get("caught by the loader", 0) + bool(caught)
        figures.trial(sw.s)
    figures.write()


@pytest.mark.timeout(300)
def test_restart_over_a_ledger_is_refused_or_fails_the_audit(dataset: Path,
                                                             tmp_path: Path) -> None:
    figures = Figures("19 restart over a ledger")
    rng = random.Random(19)
    steps = len(DataLoader(dataset, **KW))
    for t in range(RESTARTS):
        figures.start()
        ledger = tmp_path / f"run{t}.ledger"
        consumed = rng.randrange(1, steps - 1)
        first = DataLoader(dataset, ledger=ledger, **KW)
        it = iter(first)
        for _ in range(consumed):
            next(it)
        first.close()
        again = DataLoader(dataset, ledger=ledger, **KW)  # load_state_dict forgotten
        with pytest.raises(LedgerError, match="load_state_dict"):
            next(iter(again))
        again.close()
        with Stopwatch() as sw:
            report = audit(ledger, dataset=str(dataset))
        assert report.reproducible and report.check("stream").details["steps"] == consumed
        # the same restart by a writer that does not check: the audit fails it
        seg = read_ledger(ledger).segments[0]
        with LedgerWriter(ledger, seg.header) as w:
            for rec, digests in zip(seg.steps, seg.content):
                w.step(int(rec["epoch"]), int(rec["step"]), 0,
                       np.zeros(int(rec["count"]), np.int64), 0.0, 0.0, digests.tolist())
        restarted = audit(ledger, dataset=str(dataset))
        assert restarted.exit_code == 1
        assert restarted.check("resumes").details["restarts"] == 1
        figures.trial(sw.s)
    figures.write()
