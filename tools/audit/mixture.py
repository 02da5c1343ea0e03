"""The audit of a run over a mixture: replay the blend, coverage per source and pass, shares.

A mixture run's ledger header records the mixture (names, the sources' locations and
fingerprints, the exact blend weights and schedule; ``Mixture.describe``). The audit rebuilds
the mixture from it (or from ``--dataset path/to/mixture.json`` when the sources moved) and
refuses one whose fingerprint differs. Then:

* **replay**: every step's ids against ``MixtureOrder`` (the blend, then each source's pass
  order), exactly as for one dataset;
* **sources**: per source and pass, how much of the pass was consumed and whether every
  sample of it was consumed at most once (recorded ids, or the replay: a pass is a
  permutation, so matching steps that cover it read each sample exactly once);
* **proportions**: the realised share of each source over the run against the blend's exact
  target over the same positions, with a plot of the running shares.

The content check rebuilds every step's merged batch from the sources' verified shards
(:mod:`stoker.tools.audit.mixture_content`); integrity re-hashes every local source.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from stoker.loader.order.mixture import Mixture
from stoker.loader.order.mixture_order import MixtureOrder, PassOrders
from stoker.loader.order.options import OrderOptions
from stoker.manifest import StokerError
from stoker.tools.audit.integrity import integrity_check
from stoker.tools.audit.replay import DatasetView, Replayer
from stoker.tools.audit.report import Check
from stoker.tools.audit.run import Run, plan_of
from stoker.tools.audit.svg import line_chart

__all__ = ["MixtureReplayer", "MixtureView", "integrity_of_sources", "open_mixture",
           "shares_chart", "source_checks"]

_SHOWN = 32
_CHART_POINTS = 400


@dataclass(slots=True)
class MixtureView(DatasetView):
    """A :class:`DatasetView` of a mixture run (``mixture`` is ``None`` when not replayable)."""

    mixture: Mixture | None = None

    def replayer(self) -> Replayer:
        assert self.mixture is not None  # noqa: S101 - shard_rows is None otherwise
        return MixtureReplayer(self.mixture)


def open_mixture(header: dict[str, Any], override: str | None) -> MixtureView:
    """Rebuild the run's mixture from its header, or from ``override`` (a mixture.json)."""
    described = header.get("mixture") or {}
    location = override or header.get("dataset")
    if header.get("mode", "order") != "order":  # as open_dataset: a sampler's order is its own
        return MixtureView(location, None, None, "the run used its own sampler; its order is "
                           "the sampler's and cannot be replayed from the ledger")
    try:
        if override is not None:
            mixture = Mixture.load(override)
        else:
            names = [s["name"] for s in described["sources"]]
            schedule = [(int(start), {n: Fraction(w) for n, w in zip(names, ws)})
                        for start, ws in described["blend"]["segments"]]
            mixture = Mixture({s["name"]: s["dataset"] for s in described["sources"]},
                              schedule=schedule)
    except (StokerError, KeyError, TypeError, ValueError) as exc:
        return MixtureView(location, None, None, f"mixture not reachable ({exc}); pass "
                           "--dataset path/to/mixture.json")
    if mixture.fingerprint != header.get("fingerprint"):
        return MixtureView(location, None, None, f"the mixture at {location} has fingerprint "
                           f"{mixture.fingerprint}, the run read {header.get('fingerprint')}: "
                           "its sources or weights changed", changed=True)
    rows = np.concatenate([m.shard_rows for m in mixture.manifests]).astype(np.int64)
    return MixtureView(location, None, rows, None, mixture=mixture)


class MixtureReplayer(Replayer):
    """Expected ids of a mixture run's steps (:class:`MixtureOrder` instead of EpochOrder)."""

    def __init__(self, mixture: Mixture) -> None:
        super().__init__(np.concatenate([m.shard_rows for m in mixture.manifests]))
        self.mixture = mixture
        self._passes: dict[tuple[Any, ...], PassOrders] = {}

    def _order(self, header: dict[str, Any], epoch: int) -> MixtureOrder:  # type: ignore[override]
        return self.order(header, epoch)

    def order(self, header: dict[str, Any], epoch: int) -> MixtureOrder:
        """The mixture's order of loader epoch ``epoch`` under ``header``'s seed and options."""
        options = OrderOptions.from_dict(dict(header.get("order", {})))
        key = (int(header["seed"]), options)
        if key not in self._passes:
            self._passes[key] = PassOrders([m.shard_rows for m in self.mixture.manifests],
                                           [m.fingerprint for m in self.mixture.manifests],
                                           int(header["seed"]), options)
        return MixtureOrder(self.mixture, self._passes[key], epoch)


def _consumed(run: Run, view: MixtureView, match: np.ndarray | None) -> dict[str, np.ndarray]:
    """Per consumed sample of the effective records: global position, source, pick, id
    (-1 when unknown) and whether the id is proven (recorded, or replay-matched)."""
    mixture = view.mixture
    assert mixture is not None  # noqa: S101
    replayer = MixtureReplayer(mixture)
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("pos", "src", "pick", "id", "proven")}
    L = mixture.num_samples
    for i in np.flatnonzero(run.records["effective"]).tolist():
        rec = run.records[i]
        head = run.segment_header(int(rec["file"]), int(rec["seg"]))
        epoch, step, rank = int(rec["epoch"]), int(rec["step"]), int(rec["rank"])
        plan = plan_of(head, rank)
        try:
            first, stop = plan.rank_positions(step)
        except IndexError:
            continue  # a step the geometry does not have: the replay check names it
        ks = np.arange(first, stop, plan.world_size, dtype=np.int64)
        order = replayer.order(head, epoch)
        src, pick = order.sources(first, stop) if len(ks) else (ks, ks)
        src, pick = src[::plan.world_size], pick[::plan.world_size]
        got = run.record_ids(rec)
        proven = got is not None and len(got) == len(ks)
        if proven:
            ids = got
        elif match is not None and match[i]:
            ids, proven = order.rank_ids(first, stop, rank, plan.world_size), True
        else:
            ids = np.full(len(ks), -1, dtype=np.int64)
        for key, value in (("pos", epoch * L + ks), ("src", src), ("pick", pick), ("id", ids),
                           ("proven", np.full(len(ks), proven))):
            cols[key].append(np.asarray(value))
    return {k: (np.concatenate(v) if v else np.empty(0, dtype=bool if k == "proven" else np.int64))
            for k, v in cols.items()}


def _passes(mixture: Mixture, c: dict[str, np.ndarray], i: int) -> tuple[list[dict], list[str]]:
    """Coverage of every pass of source ``i`` and the problems found."""
    n, problems, out = mixture.sizes[i], [], []
    mine = c["src"] == i
    ids = c["id"][mine] - mixture.offsets[i]
    wrong = (c["id"][mine] >= 0) & ((ids < 0) | (ids >= n))
    if wrong.any():
        problems.append(f"{int(wrong.sum())} sample(s) from another source at its positions")
    passes = c["pick"][mine] // n
    for p in np.unique(passes).tolist():
        sel = passes == p
        consumed = int(sel.sum())
        known = ids[sel & c["proven"][mine] & ~wrong]
        distinct = int(len(np.unique(known)))
        dup = int(len(known) - distinct)
        entry = {"pass": p, "consumed": consumed, "of": n, "complete": consumed >= n,
                 "distinct_proven": distinct, "duplicates": dup}
        if dup:
            problems.append(f"pass {p}: {dup} sample(s) consumed twice")
        out.append(entry)
    return out, problems


def source_checks(run: Run, view: MixtureView, match: np.ndarray | None
                  ) -> tuple[Check, Check, dict[str, Any]]:
    """The ``sources`` and ``proportions`` checks and the running-share series."""
    if view.mixture is None:
        status = "fail" if view.changed else "skip"
        why = view.problem or "not replayable"
        return Check("sources", status, why), Check("proportions", status, why), {}
    mixture = view.mixture
    c = _consumed(run, view, match)
    per_source, problems = [], []
    for i, name in enumerate(mixture.names):
        passes, bad = _passes(mixture, c, i)
        problems += [f"{name}: {b}" for b in bad]
        unproven = int((~c["proven"][c["src"] == i]).sum())
        per_source.append({"source": name, "samples": mixture.sizes[i],
                           "consumed": int((c["src"] == i).sum()), "unproven": unproven,
                           "passes_complete": sum(p["complete"] for p in passes),
                           "passes": passes[:_SHOWN]})
    text = "; ".join(f"{s['source']} {s['passes_complete']} full pass(es) of {s['samples']}"
                     f" + {s['consumed'] - s['passes_complete'] * s['samples']}"
                     for s in per_source)
    if problems:
        sources = Check("sources", "fail", "; ".join(problems[:4]), {"sources": per_source})
    elif any(s["unproven"] for s in per_source):
        sources = Check("sources", "warn", text + " (some samples unproven: no ids, no replay)",
                        {"sources": per_source})
    else:
        sources = Check("sources", "pass", text + "; no sample twice within a pass",
                        {"sources": per_source})
    proportions, series = _proportions(mixture, c)
    return sources, proportions, series


def _proportions(mixture: Mixture, c: dict[str, np.ndarray]) -> tuple[Check, dict[str, Any]]:
    if not len(c["pos"]):
        return Check("proportions", "skip", "no steps recorded"), {}
    order = np.argsort(c["pos"], kind="stable")
    pos, src = c["pos"][order], c["src"][order]
    lo, hi = int(pos[0]), int(pos[-1]) + 1
    counts = np.bincount(src, minlength=len(mixture.names))
    t_lo, t_hi = mixture.blend.target(lo), mixture.blend.target(hi)
    rows, worst = [], 0.0
    contiguous = hi - lo == len(pos)
    for i, name in enumerate(mixture.names):
        target = t_hi[i] - t_lo[i]
        dev = float(counts[i] - target)
        worst = max(worst, abs(dev))
        rows.append({"source": name, "consumed": int(counts[i]), "target": float(target),
                     "realised_share": counts[i] / len(pos), "target_share": float(target) /
                     (hi - lo), "deviation": dev})
    details = {"positions": [lo, hi], "contiguous": contiguous, "sources": rows}
    series = _running_shares(mixture, pos, src)
    summary = ", ".join(f"{r['source']} {r['realised_share']:.4f} (target "
                        f"{r['target_share']:.4f})" for r in rows)
    if contiguous and worst >= 2:  # within 1 of target at both ends of the range
        return Check("proportions", "fail", f"a source is {worst:.2f} samples off its target; "
                     + summary, details), series
    note = "" if contiguous else " (positions not contiguous: shares over what was read)"
    return Check("proportions", "pass" if contiguous else "info", summary + note,
                 details), series


def _running_shares(mixture: Mixture, pos: np.ndarray, src: np.ndarray) -> dict[str, Any]:
    """Cumulative share of each source at up to ``_CHART_POINTS`` points (for the plot)."""
    at = np.unique(np.linspace(1, len(pos), min(len(pos), _CHART_POINTS)).astype(np.int64))
    onehot = np.zeros((len(pos), len(mixture.names)), dtype=np.int64)
    onehot[np.arange(len(pos)), src] = 1
    cum = np.cumsum(onehot, axis=0)[at - 1] / at[:, None]
    x = pos[at - 1].tolist()
    return {"x": x, "sources": [{"source": n, "share": cum[:, i].tolist(),
                                 "target": [float(w) for w in
                                            (seg[1][n] for seg in mixture.schedule)]}
                                for i, n in enumerate(mixture.names)]}


def integrity_of_sources(view: MixtureView, verify: bool) -> Check:
    """Every source's shards re-hashed (as ``integrity`` does for one dataset)."""
    if view.mixture is None:
        return Check("integrity", "skip", view.problem or "mixture not available")
    results = []
    for name, manifest in zip(view.mixture.names, view.mixture.manifests):
        one = integrity_check(DatasetView(manifest.root, manifest, manifest.shard_rows, None),
                              verify)
        results.append((name, one))
    bad = [(n, c) for n, c in results if c.status == "fail"]
    details = {n: c.to_dict() for n, c in results}
    if bad:
        return Check("integrity", "fail", "; ".join(f"{n}: {c.summary}" for n, c in bad),
                     details)
    status = "skip" if all(c.status == "skip" for _, c in results) else "pass"
    return Check("integrity", status, "; ".join(f"{n}: {c.summary}" for n, c in results),
                 details)


def shares_chart(series: dict[str, Any]) -> str:
    """The running share of each source over the run's positions (inline SVG)."""
    lines = [(s["source"], series["x"], s["share"]) for s in series.get("sources", [])]
    return line_chart("Realised proportions (running share of each source)", lines,
                      "global position", "share", y_max=1.0, css_class="plot shares")
