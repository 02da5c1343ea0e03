"""Data stall: how much of the run the consumer spent waiting for data, over time.

Each step record carries ``wait_s`` (time the consumer blocked in ``next()``) and
``between_s`` (time since the previous batch was handed over). A step lasted
``max(between_s, wait_s)`` (the first batch of a segment has no predecessor, so its
``between_s`` is 0 while its wait holds the start-up); the data-stall share is total wait over
total step time, and the cumulative step time of a file is its timeline (segments laid end to
end).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stoker.tools.audit.report import Check
from stoker.tools.audit.run import Run

__all__ = ["stall_check"]

_BINS = 100


def stall_check(run: Run) -> tuple[Check, dict[str, Any]]:
    """The check (always ``info``) and per-rank series for the timeline and throughput plots."""
    series: dict[str, Any] = {"ranks": []}
    r = run.records
    elapsed = np.maximum(r["between_s"], r["wait_s"])
    total_wait, total_time = float(r["wait_s"].sum()), float(elapsed.sum())
    for fi, led in enumerate(run.ledgers):
        mine = r["file"] == fi
        recs = r[mine]
        if not len(recs):
            continue
        t = np.cumsum(elapsed[mine])
        series["ranks"].append({"file": led.path, "rank": int(recs[0]["rank"]),
                                **_binned(t, recs["wait_s"], elapsed[mine], recs["count"])})
    share = total_wait / total_time if total_time > 0 else 0.0
    samples = int(r["count"].sum())
    rate = samples / total_time if total_time > 0 else 0.0
    waits = r["wait_s"] * 1e3
    details = {"stall_share": share, "wait_s": total_wait, "time_s": total_time,
               "samples": samples, "samples_per_s_per_rank": rate,
               "wait_ms_p50": float(np.percentile(waits, 50)) if len(r) else 0.0,
               "wait_ms_p99": float(np.percentile(waits, 99)) if len(r) else 0.0}
    summary = (f"{share:.1%} of the time waiting for data; "
               f"wait p50 {details['wait_ms_p50']:.2f} ms "
               f"p99 {details['wait_ms_p99']:.2f} ms; {rate:,.0f} samples/s per rank")
    return Check("stall", "info", summary, details), series


def _binned(t: np.ndarray, wait: np.ndarray, between: np.ndarray,
            count: np.ndarray) -> dict[str, list[float]]:
    """Stall share and samples/s in up to ``_BINS`` equal time bins."""
    end = float(t[-1]) if len(t) else 0.0
    if end <= 0:
        return {"t": [], "stall": [], "throughput": []}
    edges = np.linspace(0.0, end, min(_BINS, len(t)) + 1)
    which = np.clip(np.searchsorted(edges, t, side="left") - 1, 0, len(edges) - 2)
    w = np.bincount(which, weights=wait, minlength=len(edges) - 1)
    b = np.bincount(which, weights=between, minlength=len(edges) - 1)
    c = np.bincount(which, weights=count, minlength=len(edges) - 1)
    width = np.diff(edges)
    stall = np.divide(w, b, out=np.zeros_like(w), where=b > 0)
    return {"t": edges[1:].round(6).tolist(), "stall": np.clip(stall, 0, 1).round(6).tolist(),
            "throughput": (c / width).round(3).tolist()}
