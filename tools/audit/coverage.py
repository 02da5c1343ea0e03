"""Coverage: did each epoch consume every sample exactly once?

Two levels. Steps: every step of an epoch must be covered once by the effective records (all
ranks of one world size). Samples: with recorded ids, count each id directly; without them,
coverage follows from the replay (the order is a permutation, so when every step matches the
replay and every step is covered once, every sample was consumed exactly once). An epoch
whose covered steps are one contiguous run that does not span the epoch (the run stopped, or
started from a resume recorded elsewhere) is *partial*: reported, not a failure, when it is the
run's last epoch (stopped early) or its first (started late); a partial epoch between two
others skipped steps, which fails. Every missing step is listed, as ranges.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stoker.tools.audit.report import Check
from stoker.tools.audit.run import Run, plan_of

__all__ = ["coverage_check"]

_SHOWN = 32


def coverage_check(run: Run, match: np.ndarray | None) -> Check:
    """Per-epoch step and sample coverage (``match``: per-record replay result, if any)."""
    recs = run.records
    eff = recs["effective"]
    epochs: list[dict[str, Any]] = []
    present = np.unique(recs["epoch"][eff]).tolist()
    for epoch in present:
        rows = np.flatnonzero(eff & (recs["epoch"] == epoch))
        epochs.append(_epoch(run, int(epoch), rows, match, epoch == present[0],
                             epoch == present[-1]))
    details = {"epochs": epochs}
    if not epochs:
        return Check("coverage", "skip", "no steps recorded", details)
    failed = [e for e in epochs if e["status"] == "fail"]
    unknown = [e for e in epochs if e["status"] == "unverified"]
    text = "; ".join(f"epoch {e['epoch']} {e['verdict']}" for e in epochs[:4])
    text += " ..." if len(epochs) > 4 else ""
    if failed:
        return Check("coverage", "fail", text, details)
    return Check("coverage", "warn" if unknown else "pass", text, details)


def _epoch(run: Run, epoch: int, rows: np.ndarray, match: np.ndarray | None, first: bool = True,
           last: bool = True) -> dict[str, Any]:
    recs = run.records[rows]
    head = run.segment_header(int(recs[0]["file"]), int(recs[0]["seg"]))
    try:
        plan = plan_of(head)
    except (KeyError, TypeError, ValueError) as exc:
        return {"epoch": epoch, "status": "unverified", "complete": False,
                "verdict": f"unknown batch geometry (header lacks {exc})"}
    spe = plan.steps_per_epoch
    steps, dup_steps = _step_cover(recs)
    covered = np.zeros(spe, dtype=bool)
    covered[[s for s in steps if 0 <= s < spe]] = True
    runs = np.flatnonzero(np.diff(np.concatenate([[0], covered.astype(np.int8), [0]])))
    complete = bool(covered.all())
    contiguous = len(runs) <= 2
    out: dict[str, Any] = {"epoch": epoch, "steps": spe, "covered_steps": int(covered.sum()),
                           "duplicate_steps": dup_steps[:_SHOWN], "complete": complete}
    problems = []
    if dup_steps:
        problems.append(f"{len(dup_steps)} step(s) consumed twice")
    if not complete:
        holes = np.flatnonzero(~covered)
        out["missing_steps"] = holes[:_SHOWN].tolist()
        out["missing_ranges"] = _ranges(holes)
        if not contiguous:
            problems.append(f"{len(holes)} step(s) missing inside the epoch")
        elif covered.any() and not covered[-1] and not last:  # a later epoch was consumed
            problems.append(f"{_range_text(out['missing_ranges'])} skipped: never consumed "
                            f"before epoch {epoch + 1}")
        elif covered.any() and not covered[0] and not first:  # the epoch before was consumed
            problems.append(f"{_range_text(out['missing_ranges'])} skipped: never consumed "
                            f"after epoch {epoch - 1}")
    if dup_steps:
        out["duplicate_step_count"] = len(dup_steps)
    if run.has_ids:
        problems += _sample_cover(run, rows, plan, complete, out)
        out["method"] = "ids"
    elif match is not None:
        bad = int((~match[rows]).sum())
        out["method"] = "replay"
        if bad:
            problems.append(f"{bad} step(s) differ from the replay")
    else:
        out["method"] = "steps only"
    share = f"({int(covered.sum())}/{spe} steps)"
    state = "complete" if complete else f"partial {share}" if contiguous else f"incomplete {share}"
    if problems:
        out["status"], out["verdict"] = "fail", f"{state}: " + ", ".join(problems)
    elif out["method"] == "steps only":
        out["status"] = "unverified"
        out["verdict"] = f"{state}, samples unverified (no ids, no replay)"
    else:
        out["status"] = "pass"
        out["verdict"] = (f"{state}: every sample exactly once" if complete
                          else f"{state}, no sample twice")
    return out


def _step_cover(recs: np.ndarray) -> tuple[list[int], list[int]]:
    """Steps fully covered (all ranks of a world size once) and steps covered more than once."""
    steps, worlds, ranks = recs["step"], recs["world"], recs["rank"]
    pairs = np.unique(np.stack([steps, worlds]), axis=1)  # distinct (step, world size)
    multi, n_worlds = np.unique(pairs[0], return_counts=True)
    dups = set(multi[n_worlds > 1].tolist())  # one step recorded under two world sizes
    full: set[int] = set()
    for w in np.unique(worlds).tolist():
        sel = (worlds == w) & (ranks < w)
        keys, counts = np.unique(steps[sel] * w + ranks[sel], return_counts=True)
        dups |= set((keys[counts > 1] // w).tolist())
        covered, n_ranks = np.unique(keys // w, return_counts=True)
        full |= set(covered[n_ranks == w].tolist())
    return sorted(full), sorted(dups)


def _sample_cover(run: Run, rows: np.ndarray, plan: Any, complete: bool,
                  out: dict[str, Any]) -> list[str]:
    ids = np.concatenate([run.record_ids(run.records[i]) for i in rows]) if len(rows) else \
        np.empty(0, dtype=np.int64)
    n = plan.num_samples
    problems = []
    bad = ids[(ids < 0) | (ids >= n)]
    if bad.size:
        out["out_of_range_ids"] = bad[:_SHOWN].tolist()
        problems.append(f"{bad.size} id(s) outside [0, {n})")
    counts = np.bincount(ids[(ids >= 0) & (ids < n)], minlength=n)
    dup = np.flatnonzero(counts > 1)
    out["consumed_samples"], out["distinct_samples"] = int(ids.size), int((counts > 0).sum())
    out["duplicate_ids"] = dup[:_SHOWN].tolist()
    if dup.size:
        problems.append(f"{dup.size} sample(s) consumed more than once")
    if complete:
        expected = plan.steps_per_epoch * plan.global_batch if plan.drop_last else n
        missing = np.flatnonzero(counts == 0)
        if int((counts > 0).sum()) < expected:
            if not plan.drop_last:
                out["missing_ids"] = missing[:_SHOWN].tolist()
            problems.append(f"{expected - int((counts > 0).sum())} sample(s) never consumed")
    return problems


def _ranges(steps: np.ndarray) -> list[list[int]]:
    """Sorted step numbers as ``[first, last]`` runs (every gap, however many)."""
    if not len(steps):
        return []
    cuts = np.flatnonzero(np.diff(steps) != 1) + 1
    return [[int(r[0]), int(r[-1])] for r in np.split(steps, cuts)]


def _range_text(ranges: list[list[int]]) -> str:
    return ", ".join(f"step {a}" if a == b else f"steps {a}-{b}" for a, b in ranges[:8]) + \
        (" ..." if len(ranges) > 8 else "")
