"""Two-run comparison: the first step where two runs consumed different samples.

Steps are matched by (epoch, step, world size, rank) over each run's effective records; a run
that simply went further than the other is reported, not failed. Header differences are listed
(host, process and start time are expected to differ and are left out).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stoker.tools.audit.replay import Replayer
from stoker.tools.audit.report import Check
from stoker.tools.audit.run import Run
from stoker.tools.audit.stream import effective_order

__all__ = ["compare_check", "header_diff"]

_VOLATILE = ("host", "pid", "start_time", "segment", "dropped_tail_bytes", "dataset")
_SHOWN = 32


def header_diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, list[Any]]:
    """Keys whose values differ between two headers (versions compared one by one)."""
    out: dict[str, list[Any]] = {}
    for key in sorted(set(a) | set(b)):
        if key in _VOLATILE:
            continue
        va, vb = a.get(key), b.get(key)
        if key == "versions" and isinstance(va, dict) and isinstance(vb, dict):
            out.update({f"versions.{k}": [va.get(k), vb.get(k)]
                        for k in sorted(set(va) | set(vb)) if va.get(k) != vb.get(k)})
        elif va != vb:
            out[key] = [va, vb]
    return out


def compare_check(a: Run, b: Run, replayer: Replayer | None,
                  match_a: np.ndarray | None = None, match_b: np.ndarray | None = None) -> Check:
    """First divergence between runs ``a`` and ``b`` (fails if any common step differs).

    Steps are compared as whole global batches: the ranks' (count, digest) when both runs used
    the same world size; across world sizes (an elastic resume), by both runs matching the
    replay of the same order (``match_a``/``match_b``), since digests of different rank splits
    cannot be compared directly.
    """
    ka, kb = _keyed(a, match_a), _keyed(b, match_b)
    same_order = all(_plain(a.header.get(k)) == _plain(b.header.get(k)) for k in _ORDER_KEYS)
    common = sorted(set(ka) & set(kb))
    diffs = header_diff(a.header, b.header)
    details: dict[str, Any] = {"header_differences": diffs, "common_steps": len(common),
                               "only_in_first": len(set(ka) - set(kb)),
                               "only_in_second": len(set(kb) - set(ka))}
    verdicts = {k: _same(ka[k], kb[k], same_order) for k in common}
    differing = [k for k in common if verdicts[k] is False]
    unknown = [k for k in common if verdicts[k] is None]
    details["differing_steps"] = len(differing)
    details["incomparable_steps"] = len(unknown)
    if differing:
        e, s = differing[0]
        details["first_divergence"] = _divergence(a, b, ka[e, s], kb[e, s], replayer)
        return Check("comparison", "fail", f"runs diverge at epoch {e} step {s} "
                     f"({len(differing)} of {len(common)} common steps differ); header "
                     f"differences: {sorted(diffs) or 'none'}", details)
    if not common:
        return Check("comparison", "fail", "the runs share no step to compare "
                     f"(header differences: {sorted(diffs) or 'none'})", details)
    if unknown:
        return Check("comparison", "warn", f"{len(unknown)} of {len(common)} common steps were "
                     "recorded under different world sizes and cannot be compared without a "
                     "replay (pass --dataset); the others are identical", details)
    extra = ""
    if details["only_in_first"] or details["only_in_second"]:
        extra = (f"; {details['only_in_first']} step(s) only in the first run, "
                 f"{details['only_in_second']} only in the second")
    return Check("comparison", "pass", f"identical on all {len(common)} common steps{extra}; "
                 f"header differences: {sorted(diffs) or 'none'}", details)


_ORDER_KEYS = ("fingerprint", "seed", "order", "num_samples", "global_batch", "drop_last")


def _plain(value: Any) -> str:
    return repr(sorted(value.items())) if isinstance(value, dict) else repr(value)


def _same(x: dict[str, Any], y: dict[str, Any], same_order: bool) -> bool | None:
    """True/False, or None when different world sizes leave nothing to compare."""
    if x["world"] == y["world"]:
        return x["sig"] == y["sig"]
    if x["replayed"] is None or y["replayed"] is None:
        return None
    return same_order and x["replayed"] and y["replayed"]


def _keyed(run: Run, match: np.ndarray | None) -> dict[tuple[int, int], dict[str, Any]]:
    """Per (epoch, step): world size, (rank, count, digest) signature, rows, replay verdict."""
    r = run.records
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for i in effective_order(run):
        row = r[i]
        key = (int(row["epoch"]), int(row["step"]))
        entry = out.setdefault(key, {"world": set(), "sig": [], "rows": [],
                                     "replayed": None if match is None else True})
        entry["world"].add(int(row["world"]))
        entry["sig"].append((int(row["world"]), int(row["rank"]), int(row["count"]),
                             int(row["digest"])))
        entry["rows"].append(int(i))
        if match is not None:
            entry["replayed"] &= bool(match[i])
    for entry in out.values():
        entry["world"] = tuple(sorted(entry["world"]))
    return out


def _divergence(a: Run, b: Run, ea: dict[str, Any], eb: dict[str, Any],
                replayer: Replayer | None) -> dict[str, Any]:
    """The first differing rank's records (the first rank if the world sizes differ)."""
    pairs = [(i, j) for i, j in zip(ea["rows"], eb["rows"])
             if (a.records[i]["count"], a.records[i]["digest"])
             != (b.records[j]["count"], b.records[j]["digest"])]
    ia, ib = pairs[0] if pairs else (ea["rows"][0], eb["rows"][0])
    ra, rb = a.records[ia], b.records[ib]
    out: dict[str, Any] = {"epoch": int(ra["epoch"]), "step": int(ra["step"]),
                           "first_rank": int(ra["rank"]), "second_rank": int(rb["rank"]),
                           "first_world": list(ea["world"]), "second_world": list(eb["world"]),
                           "first_count": int(ra["count"]), "second_count": int(rb["count"]),
                           "first_digest": f"{int(ra['digest']):016x}",
                           "second_digest": f"{int(rb['digest']):016x}"}
    ids_a, ids_b = a.record_ids(ra), b.record_ids(rb)
    if replayer is not None:
        try:
            head = a.segment_header(int(ra["file"]), int(ra["seg"]))
            out["first_expected_ids"] = replayer.expected(
                head, int(ra["epoch"]), int(ra["step"]), int(ra["rank"]))[:_SHOWN].tolist()
        except (ValueError, KeyError, IndexError):
            pass
    if ids_a is not None:
        out["first_ids"] = ids_a[:_SHOWN].tolist()
    if ids_b is not None:
        out["second_ids"] = ids_b[:_SHOWN].tolist()
    if ids_a is not None and ids_b is not None:
        out["only_in_first"] = np.setdiff1d(ids_a, ids_b)[:_SHOWN].tolist()
        out["only_in_second"] = np.setdiff1d(ids_b, ids_a)[:_SHOWN].tolist()
    return out
