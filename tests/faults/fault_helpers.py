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
    """Counts trials, passes and the worst recovery time of one case; written at the end."""

    def __init__(self, case: str) -> None:
        self.case, self.trials, self.passes, self.worst = case, 0, 0, 0.0

    def trial(self, recovery_s: float, passed: bool = True) -> None:
        self.trials += 1
        self.passes += int(passed)
        self.worst = max(self.worst, recovery_s)

    def write(self) -> None:
        path = os.environ.get("STOKER_FAULT_FIGURES")
        if not path:
            return
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"case": self.case, "trials": self.trials, "passes": self.passes,
                                "worst_recovery_s": round(self.worst, 3)}) + "\n")


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
