"""Shared helpers for the fault-injection suite: small datasets, expected sequences, trials.

``trials(name, ci)`` is the trial count of a case: ``ci`` in CI, multiplied by the environment
variable ``STOKER_FAULT_TRIALS_SCALE`` (``bench/faults_report.py`` raises it to the issue's full
counts). ``record(name, ...)`` appends a case's figures to the file named by
``STOKER_FAULT_FIGURES`` (JSON lines), which the report turns into a table.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from shard_writer import write_dataset  # noqa: E402

from stoker.manifest import Manifest  # noqa: E402

__all__ = ["Figures", "expected_ids", "ids_of", "make_dataset", "trials"]


def trials(ci: int, full: int) -> int:
    """Trials of a case: ``ci`` normally, up to ``full`` (the issue's count) when scaled."""
    scale = float(os.environ.get("STOKER_FAULT_TRIALS_SCALE", "1"))
    return max(1, min(full, round(ci * scale))) if scale > 1 else ci


class Figures:
    """Trials and failures of one case, counted separately; the worst recovery time.

    ``start()`` opens a trial (counted at once), ``trial(recovery_s)`` closes it as passed;
    ``notes`` holds further counts of the case (the report lists them under the table).
    A trial that raises in between is a failure: ``failures = trials - passes``. Every
    ``Figures`` is written when its test ends, passed or failed (the autouse fixture in
    conftest.py), so the report shows failed trials instead of losing the case.
    """

    made: list["Figures"] = []  # this test's figures, written by the fixture at teardown

    def __init__(self, case: str) -> None:
        self.case, self.trials, self.passes, self.worst = case, 0, 0, 0.0
        self.notes: dict[str, int] = {}  # further counts a case reports (summed per case)
        self._open = False
        self._written = False
        Figures.made.append(self)

    @property
    def failures(self) -> int:
        return self.trials - self.passes

    def start(self) -> None:
        """A trial begins: it counts from now, whatever happens."""
        if self._open:
            raise AssertionError(f"{self.case}: start() twice without trial() in between")
        self.trials += 1
        self._open = True

    def trial(self, recovery_s: float) -> None:
        """The trial started last passed; ``recovery_s`` is its recovery time."""
        if not self._open:
            raise AssertionError(f"{self.case}: trial() without start(): a trial must be "
                                 "counted before its checks run, or a failure could not show")
        self._open = False
        self.passes += 1
        self.worst = max(self.worst, recovery_s)

    def write(self) -> None:
        if self._written:
            return
        self._written = True
        path = os.environ.get("STOKER_FAULT_FIGURES")
        if not path or not self.trials:
            return
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"case": self.case, "trials": self.trials,
                                "failures": self.failures,
                                "worst_recovery_s": round(self.worst, 3),
                                **({"notes": self.notes} if self.notes else {})}) + "\n")


def make_dataset(root: Path, shard_rows: Iterable[int], batch_rows: int = 16,
                 payload: int = 32) -> Manifest:
    """Arrow shards whose ``id`` column is the global sample id and whose ``x``/``blob`` columns
    are derived from it, so any corrupted sample is detectable (see :func:`check_batch`)."""
    rows = list(shard_rows)
    starts = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
    tables = []
    for s in range(len(rows)):
        ids = np.arange(starts[s], starts[s + 1], dtype=np.int64)
        tables.append(pa.table({
            "id": ids,
            "x": (ids * 0.5).astype(np.float32),
            "blob": pa.array([int(i).to_bytes(8, "little") * (payload // 8) for i in ids],
                             pa.binary()),
        }))
    return write_dataset(root, tables, batch_rows=batch_rows)


def ids_of(batches: Iterable[Any]) -> list[int]:
    """Flat sample ids of ``batches``, after checking every sample is intact."""
    out: list[int] = []
    for b in batches:
        check_batch(b)
        out.extend(b["id"].tolist())
    return out


def check_batch(batch: Any) -> None:
    """Every column of every sample agrees with its id (a corrupted sample fails)."""
    ids = batch["id"].numpy()
    x = batch["x"].numpy()
    if not np.array_equal(x, (ids * 0.5).astype(np.float32)):
        raise AssertionError(f"corrupted x in batch with ids {ids[:8].tolist()}")
    for i, blob in zip(ids.tolist(), batch["blob"]):
        if bytes(blob) != int(i).to_bytes(8, "little") * (len(blob) // 8) or not blob:
            raise AssertionError(f"corrupted blob of sample {i}")


def expected_ids(path: Any, epoch: int = 0, **kw: Any) -> list[int]:
    """The uninterrupted sequence of epoch ``epoch`` of a local loader with options ``kw``."""
    from stoker.loader import DataLoader

    dl = DataLoader(path, **kw)
    dl.set_epoch(epoch)
    try:
        return ids_of(dl)
    finally:
        dl.close()


class Stopwatch:
    """``with Stopwatch() as sw: ...``; ``sw.s`` is the elapsed wall time in seconds."""

    def __enter__(self) -> "Stopwatch":
        self._t0 = time.monotonic()
        self.s = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self.s = time.monotonic() - self._t0
