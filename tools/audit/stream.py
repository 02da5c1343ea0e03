"""Stream checks: identity of the run, continuity of each rank's steps, resumes, truncation."""

from __future__ import annotations

from typing import Any

import numpy as np

from stoker.tools.audit.report import Check
from stoker.tools.audit.run import Run

__all__ = ["effective_order", "events_check", "identity_check", "resume_check", "stream_check"]

# Header keys that must not change between segments of one run: they define the order.
_ORDER_KEYS = ("fingerprint", "seed", "order", "num_samples", "global_batch", "drop_last", "kind")
_REQUIRED = ("fingerprint", "seed", "num_samples", "global_batch", "world_size", "rank")
_SHOWN = ("dataset", "kind", "fingerprint", "num_samples", "seed", "order", "global_batch",
          "world_size", "drop_last", "num_workers", "worker_mode", "mode")


def identity_check(run: Run) -> Check:
    """What the run was; fails when segments disagree on anything that defines the order."""
    heads = run.headers
    if not heads:
        return Check("identity", "fail", "no readable header in any ledger file",
                     {"files": [led.path for led in run.ledgers]})
    first = heads[0]
    missing = sorted({k for h in heads for k in _REQUIRED if k not in h})
    changed = {k: sorted({_plain(h.get(k)) for h in heads}) for k in _ORDER_KEYS
               if len({_plain(h.get(k)) for h in heads}) > 1}
    details: dict[str, Any] = {k: first.get(k) for k in _SHOWN}
    details.update(
        files=[led.path for led in run.ledgers], segments=len(heads),
        world_sizes=sorted({int(h.get("world_size", 1)) for h in heads}),
        hosts=sorted({str(h.get("host")) for h in heads}),
        versions=first.get("versions", {}),
        start_times=[h.get("start_time") for h in heads], changed_between_segments=changed)
    summary = (f"fingerprint {str(first.get('fingerprint'))[:12]}.. seed {first.get('seed')} "
               f"samples {first.get('num_samples')} batch {first.get('global_batch')} "
               f"world {','.join(map(str, details['world_sizes']))} "
               f"({len(run.ledgers)} file(s), {len(heads)} segment(s))")
    if missing:
        details["missing_keys"] = missing
        return Check("identity", "fail", f"headers lack {missing}: the run cannot be replayed; "
                     + summary, details)
    if changed:
        return Check("identity", "fail", f"segments disagree on {sorted(changed)}; " + summary,
                     details)
    return Check("identity", "pass", summary, details)


def _plain(value: Any) -> str:
    return repr(sorted(value.items())) if isinstance(value, dict) else repr(value)


def resume_check(run: Run) -> Check:
    """Each resume: where it pointed, what it rolled back, and whether the stream went on there."""
    items = []
    for r in run.resumes:
        items.append({"file": run.ledgers[r.file].path, "segment": r.seg, "epoch": r.epoch,
                      "step": r.step, "explicit": r.explicit, "rolled_back_steps": r.rolled_back,
                      "gap": _gap_text(r.gap), "restart": r.restart,
                      "next_recorded": list(r.next_pos) if r.next_pos else None, "exact": r.exact})
    bad = [i for i in items if not i["exact"]]
    restarts = [i for i in items if i["restart"]]
    details = {"resumes": items, "restarts": len(restarts)}
    if not items:
        return Check("resumes", "pass", "no resumes", details)
    if restarts:
        b = restarts[0]
        return Check("resumes", "fail", f"{len(restarts)} restart(s) over the ledger without a "
                     f"resume; first: {b['file']} segment {b['segment']} started at epoch "
                     f"{b['epoch']} step {b['step']} and recorded {b['rolled_back_steps']} "
                     "step(s) again" + (f", skipping {b['gap']}" if b["gap"] else ""), details)
    if bad:
        b = bad[0]
        why = f"skipped {b['gap']}" if b["gap"] else f"next recorded step was {b['next_recorded']}"
        return Check("resumes", "fail", f"{len(bad)} of {len(items)} resumes did not continue "
                     f"exactly; first: resume to epoch {b['epoch']} step {b['step']}, {why}",
                     details)
    where = ", ".join(f"e{i['epoch']}s{i['step']}" for i in items[:6])
    back = sum(i["rolled_back_steps"] for i in items)
    return Check("resumes", "pass", f"{len(items)} resume(s) at {where}"
                 f"{' ...' if len(items) > 6 else ''}, each continued exactly"
                 f"{f' ({back} steps recomputed after restores)' if back else ''}", details)


def events_check(run: Run) -> Check:
    """Events other than resumes (retry, quarantine, worker restart, skip): counted and listed.

    Skipped samples make the run differ from its order on purpose; they are a warning here
    and show up as missing samples in coverage and mismatches in the replay.
    """
    events = [{**e, "file": led.path} for led in run.ledgers for e in led.events
              if e.get("kind") != "resume"]
    counts: dict[str, int] = {}
    for e in events:
        counts[str(e.get("kind"))] = counts.get(str(e.get("kind")), 0) + 1
    details = {"counts": counts, "events": events[:200]}
    if not events:
        return Check("events", "pass", "no retries, quarantines, worker restarts or skips", details)
    text = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    return Check("events", "warn" if "skip" in counts else "info", text, details)


def _gap_text(gap: tuple[int, int, int, int] | None) -> str | None:
    if gap is None:
        return None
    return f"epoch {gap[0]} step {gap[1]} up to (not including) epoch {gap[2]} step {gap[3]}"


def stream_check(run: Run) -> Check:
    """Consecutive steps of each file follow each other; report truncated or unclosed files."""
    jumps: list[dict[str, Any]] = []
    resume_at = {(r.file, r.at) for r in run.resumes}
    for fi in range(len(run.ledgers)):
        recs = run.records[(run.records["file"] == fi) & run.records["effective"]]
        if len(recs) < 2:
            continue
        per_seg = np.array([run.steps_per_epoch(seg.header) or 0
                            for seg in run.ledgers[fi].segments], dtype=np.int64)
        spe = per_seg[recs["seg"]]
        e, st = recs["epoch"], recs["step"]
        wrap = (spe > 0) & (st + 1 >= spe)
        ok = ((e[1:] == e[:-1]) & (st[1:] == st[:-1] + 1)) | (
            (e[1:] == e[:-1] + 1) & (st[1:] == 0) & (wrap[:-1] | (spe[:-1] == 0)))
        for i in np.flatnonzero(~ok):
            a, b = recs[i], recs[i + 1]
            if (fi, int(b["idx"])) in resume_at:
                continue  # judged by the resume check
            ea, sa, eb, sb = int(a["epoch"]), int(a["step"]), int(b["epoch"]), int(b["step"])
            kind = "epoch ended early" if eb == ea + 1 and sb == 0 else "jump"
            jumps.append({"file": run.ledgers[fi].path, "from": [ea, sa], "to": [eb, sb],
                          "kind": kind})
    truncated = [{"file": led.path, "at_byte": led.truncated_at, "size": led.size,
                  "readable_steps": int(sum(len(s.steps) for s in led.segments))}
                 for led in run.ledgers if led.truncated]
    unclosed = [led.path for led in run.ledgers if led.segments and not led.segments[-1].closed]
    details = {"discontinuities": jumps, "truncated": truncated, "unclosed": unclosed,
               "steps": int(len(run.records)),
               "effective_steps": int(run.records["effective"].sum())}
    hard = [j for j in jumps if j["kind"] == "jump"]
    if hard:
        j = hard[0]
        return Check("stream", "fail", f"{len(hard)} jump(s) in the step sequence; first from "
                     f"epoch/step {j['from']} to {j['to']} in {j['file']}", details)
    if truncated:
        t = truncated[0]
        return Check("stream", "warn", f"{len(truncated)} ledger(s) cut short by a crash; "
                     f"{t['file']} is readable up to byte {t['at_byte']} of {t['size']} "
                     f"({t['readable_steps']} steps)", details)
    note = f"; {len(jumps)} epoch(s) ended early" if jumps else ""
    note += f"; {len(unclosed)} file(s) ended without close()" if unclosed else ""
    return Check("stream", "pass", f"{details['effective_steps']} steps in sequence{note}", details)


def effective_order(run: Run) -> np.ndarray:
    """Indices of effective records sorted by (epoch, step, world, rank)."""
    r = run.records
    idx = np.flatnonzero(r["effective"])
    return idx[np.lexsort((r["rank"][idx], r["world"][idx], r["step"][idx], r["epoch"][idx]))]
