"""A run as the audit sees it: every rank's ledger file, flattened into one record table.

``RUN`` is a ledger file (``runs/a.ledger``; its per-rank siblings ``runs/a.rank*.ledger`` are
included), a per-rank name whose plain file does not exist, or a directory (every
``*.ledger`` inside). Each step record becomes a row of :data:`REC_DTYPE` carrying where it
came from (file, segment, index) and the world size it was recorded under, so the checks can
work on arrays instead of nested segments.

Effective stream: a resume (the ``"resume"`` event, or a new segment that records steps
without one: a start at its header's ``(start_epoch, start_step)``) rolls a file back to the
resumed position,
exactly as the training state was rolled back; the steps recorded after that position before
the resume were recomputed, so they are not part of the data the final model saw. They are
kept out of coverage and comparison (``effective`` is False) but still replayed. A segment
without a resume event that does not continue exactly where its file stood is a *restart over
the ledger* (:attr:`Resume.restart`): the resume check fails it. Rollback is
applied per file, and for an elastic resume (another world size, so other files) also to the
older world's segments that started before the resuming one (segment start times, UTC).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stoker.loader.ledger.writer import Ledger, LedgerError, read_ledger
from stoker.loader.order.schedule import BatchPlan
from stoker.tools.cli import UsageError

__all__ = ["REC_DTYPE", "Resume", "Run", "load_run", "pos_key", "resolve_files"]

REC_DTYPE = np.dtype([("epoch", "<i8"), ("step", "<i8"), ("rank", "<i4"), ("world", "<i4"),
                      ("count", "<i8"), ("digest", "<u8"), ("wait_s", "<f8"),
                      ("between_s", "<f8"), ("file", "<i4"), ("seg", "<i4"), ("idx", "<i8"),
                      ("id_lo", "<i8"), ("id_hi", "<i8"), ("effective", "?")])


def pos_key(epoch: Any, step: Any) -> Any:
    """One sortable integer for an (epoch, step) position (works on arrays too)."""
    return np.asarray(epoch, dtype=np.int64) * (1 << 32) + np.asarray(step, dtype=np.int64)


@dataclass(slots=True)
class Resume:
    """A resume found in a file: where it pointed and what happened around it."""

    file: int
    seg: int
    at: int  # records of the file before it
    epoch: int
    step: int
    explicit: bool  # a "resume" event (False: a new segment that started without one)
    rolled_back: int = 0  # records recomputed after the restore
    gap: tuple[int, int, int, int] | None = None  # (epoch, step) after last kept .. before target
    next_pos: tuple[int, int] | None = None  # what was recorded next
    state: dict[str, Any] | None = None

    @property
    def exact(self) -> bool:
        continued = self.next_pos is None or self.next_pos == (self.epoch, self.step)
        return self.gap is None and continued

    @property
    def restart(self) -> bool:
        """A new segment that started recording without a resume and not where the file's run
        stood: its loader began again over the ledger (steps seen twice, or skipped)."""
        return not self.explicit and (self.rolled_back > 0 or not self.exact)


@dataclass(slots=True)
class Run:
    """All ledgers of one run: files, headers and one table of step records."""

    path: str
    ledgers: list[Ledger]
    records: np.ndarray
    ids: list[np.ndarray | None]  # per file: ids concatenated over segments (or None)
    resumes: list[Resume] = field(default_factory=list)

    @property
    def headers(self) -> list[dict[str, Any]]:
        return [seg.header for led in self.ledgers for seg in led.segments]

    @property
    def header(self) -> dict[str, Any]:
        heads = self.headers
        return heads[0] if heads else {}

    @property
    def has_ids(self) -> bool:
        return bool(self.ledgers) and all(i is not None for i in self.ids)

    def segment_header(self, file: int, seg: int) -> dict[str, Any]:
        return self.ledgers[file].segments[seg].header

    def record_ids(self, row: np.void) -> np.ndarray | None:
        ids = self.ids[int(row["file"])]
        return None if ids is None else ids[int(row["id_lo"]):int(row["id_hi"])]

    def steps_per_epoch(self, header: dict[str, Any]) -> int | None:
        try:
            return plan_of(header).steps_per_epoch
        except (KeyError, TypeError, ValueError):
            return None


def plan_of(header: dict[str, Any], rank: int | None = None) -> BatchPlan:
    """The batch geometry a segment header describes (for ``rank``, default its own)."""
    return BatchPlan(int(header["num_samples"]), int(header["global_batch"]),
                     int(header.get("world_size", 1)),
                     int(header.get("rank", 0) if rank is None else rank),
                     bool(header.get("drop_last", False)))


def resolve_files(path: str | os.PathLike[str]) -> list[Path]:
    """The ledger files ``path`` names (see the module docstring); UsageError if none."""
    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("*.ledger"))
    else:
        stem = p.stem if p.suffix else p.name
        siblings = sorted(p.parent.glob(f"{stem}.rank*{p.suffix or '.ledger'}"))
        files = ([p] if p.is_file() else []) + siblings
    if not files:
        raise UsageError(f"{path}: no ledger found; pass a ledger file or a directory of "
                         "per-rank *.ledger files written with DataLoader(ledger=...).")
    return files


def load_run(path: str | os.PathLike[str]) -> Run:
    """Read every ledger of the run at ``path`` and build its record table."""
    try:
        ledgers = [read_ledger(f) for f in resolve_files(path)]
    except LedgerError as exc:  # not a ledger at all: the user pointed at the wrong file
        raise UsageError(str(exc)) from None
    tables, ids = [], []
    for fi, led in enumerate(ledgers):
        table, file_ids = _file_table(fi, led)
        tables.append(table)
        ids.append(file_ids)
    records = np.concatenate(tables) if tables else np.empty(0, dtype=REC_DTYPE)
    run = Run(str(path), ledgers, records, ids)
    for fi in range(len(ledgers)):
        run.resumes += _apply_resumes(run, fi)
    for r in run.resumes:
        _roll_back_older_world(run, r)
    return run


def _roll_back_older_world(run: Run, r: Resume) -> None:
    """An elastic resume also rolls back what an older world size recorded in other files.

    Segments of other files written under another world size that started before the resuming
    segment belong to the run being resumed; their steps at or after the resume point were
    recomputed by the new world. (Same-size worlds resume every rank in its own file.)
    """
    head = run.segment_header(r.file, r.seg)
    world, started = int(head.get("world_size", 1)), str(head.get("start_time", ""))
    recs = run.records
    older = np.zeros(len(recs), dtype=bool)
    for fi, led in enumerate(run.ledgers):
        for si, seg in enumerate(led.segments):
            h = seg.header
            if fi != r.file and int(h.get("world_size", 1)) != world \
                    and str(h.get("start_time", "")) < started:
                older |= (recs["file"] == fi) & (recs["seg"] == si)
    back = older & recs["effective"] & (pos_key(recs["epoch"], recs["step"])
                                        >= pos_key(r.epoch, r.step))
    recs["effective"][back] = False
    r.rolled_back += int(back.sum())


def _file_table(fi: int, led: Ledger) -> tuple[np.ndarray, np.ndarray | None]:
    parts, id_parts, base_ids, base = [], [], 0, 0
    for si, seg in enumerate(led.segments):
        n = len(seg.steps)
        t = np.zeros(n, dtype=REC_DTYPE)
        for name in ("epoch", "step", "rank", "count", "digest", "wait_s", "between_s"):
            t[name] = seg.steps[name]
        t["world"] = int(seg.header.get("world_size", 1))
        t["file"], t["seg"] = fi, si
        t["idx"] = np.arange(base, base + n)
        ends = base_ids + np.cumsum(t["count"])
        t["id_hi"], t["id_lo"] = ends, ends - t["count"]
        t["effective"] = True
        base += n
        base_ids = int(ends[-1]) if n else base_ids
        parts.append(t)
        id_parts.append(seg.ids)
    table = np.concatenate(parts) if parts else np.empty(0, dtype=REC_DTYPE)
    has_ids = bool(id_parts) and all(i is not None for i in id_parts)
    return table, (np.concatenate(id_parts) if has_ids else None)


def _resume_points(run: Run, fi: int) -> list[Resume]:
    """Explicit resume events, plus segment starts that had none (a fresh start)."""
    out, base = [], 0
    for si, seg in enumerate(run.ledgers[fi].segments):
        explicit = [e for e in seg.events if e.get("kind") == "resume"]
        for e in explicit:
            epoch, step, state = _resume_target(e)
            if epoch is not None:
                out.append(Resume(fi, si, base + int(e["at"]), epoch, step, True, state=state))
        if si > 0 and len(seg.steps) and not any(int(e["at"]) == 0 for e in explicit):
            start = int(seg.header.get("start_epoch", 0))
            out.append(Resume(fi, si, base, start, int(seg.header.get("start_step", 0)), False))
        base += len(seg.steps)
    return sorted(out, key=lambda r: r.at)


def _resume_target(event: dict[str, Any]) -> tuple[int | None, int, dict[str, Any] | None]:
    state = event.get("state") if isinstance(event.get("state"), dict) else None
    src = event if "epoch" in event and "step" in event else (state or {})
    if "epoch" not in src or "step" not in src:
        return None, 0, state
    return int(src["epoch"]), int(src["step"]), state


def _apply_resumes(run: Run, fi: int) -> list[Resume]:
    """Roll the file back at each resume and note gaps and whether the stream continued."""
    rows = np.flatnonzero(run.records["file"] == fi)
    recs = run.records[rows]
    keys = pos_key(recs["epoch"], recs["step"])
    resumes = _resume_points(run, fi)
    for r in resumes:
        head = run.segment_header(fi, r.seg)
        spe = run.steps_per_epoch(head)
        if spe is not None and r.step >= spe:  # a state saved at an epoch's end
            r.epoch, r.step = r.epoch + 1, 0
        target = int(pos_key(r.epoch, r.step))
        before = np.arange(len(recs)) < r.at
        back = before & recs["effective"] & (keys >= target)
        r.rolled_back = int(back.sum())
        run.records["effective"][rows[back]] = False
        recs["effective"][back] = False
        kept = np.flatnonzero(before & recs["effective"])
        if kept.size:
            last = recs[kept[-1]]
            nxt = _next_pos(int(last["epoch"]), int(last["step"]), spe)
            if int(pos_key(*nxt)) < target:
                r.gap = (*nxt, r.epoch, r.step)
        if r.at < len(recs):
            r.next_pos = (int(recs[r.at]["epoch"]), int(recs[r.at]["step"]))
    return resumes


def _next_pos(epoch: int, step: int, spe: int | None) -> tuple[int, int]:
    if spe is not None and step + 1 >= spe:
        return epoch + 1, 0
    return epoch, step + 1
