"""Replay: recompute what every step should have consumed and compare with the ledger.

The order of an epoch is a pure function of (shard rows, fingerprint, seed, epoch, order
options), all of which a segment header records except the shard rows, which come from the
dataset's manifest (reloaded from the header's ``dataset`` or the ``--dataset`` override) or,
for a generic torch dataset, from its length. A manifest whose fingerprint differs from the
header's is a different dataset: the replay refuses it and the check fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker.loader.ledger.format import ids_digest
from stoker.loader.order.epoch import EpochOrder, OrderOptions
from stoker.loader.order.schedule import rank_batch_ids
from stoker.manifest import Manifest, StokerError
from stoker.tools.audit.report import Check
from stoker.tools.audit.run import Run, plan_of

__all__ = ["DatasetView", "Replayer", "open_dataset", "replay_check"]

_SHOWN_IDS = 32


@dataclass(slots=True)
class DatasetView:
    """What the audit could learn about the run's dataset.

    Attributes:
        location: where it looked (redacted in the header already).
        manifest: the manifest when reachable and matching, else ``None``.
        shard_rows: rows per shard for the replay, or ``None`` when it cannot replay.
        problem: why the replay cannot run (``None`` when it can).
        changed: True when a manifest was found but its fingerprint differs (a fail).
    """

    location: str | None
    manifest: Manifest | None
    shard_rows: np.ndarray | None
    problem: str | None
    changed: bool = False

    def replayer(self) -> "Replayer":
        """What recomputes the run's steps (a mixture's view returns its own)."""
        return Replayer(self.shard_rows)  # type: ignore[arg-type]


def open_dataset(header: dict[str, Any], override: str | None) -> DatasetView:
    """Find the run's dataset (see the module docstring)."""
    if header.get("mode", "order") != "order":
        return DatasetView(None, None, None, "the run used its own sampler; its order is the "
                           "sampler's and cannot be replayed from the ledger")
    if header.get("kind") == "torch":
        n = int(header.get("dataset_len", header.get("num_samples", 0)))
        return DatasetView(None, None, _virtual_rows(n), None)
    location = override or header.get("dataset")
    if not location:
        return DatasetView(None, None, None, "the ledger names no dataset; pass --dataset PATH")
    try:
        manifest = Manifest.load(location)
    except (StokerError, OSError, ImportError) as exc:  # the replay is skipped, saying why
        why = _short(exc)
        return DatasetView(location, None, None, f"dataset not reachable ({why}); pass --dataset")
    if manifest.fingerprint != header.get("fingerprint"):
        return DatasetView(location, manifest, None,
                           f"dataset at {location} has fingerprint {manifest.fingerprint}, "
                           f"the run read {header.get('fingerprint')}: the data changed",
                           changed=True)
    return DatasetView(location, manifest, manifest.shard_rows, None)


def _short(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:200]}" if not isinstance(exc, StokerError) else text


def _virtual_rows(n: int) -> np.ndarray:
    try:
        from stoker.loader.read.torch_dataset import virtual_shard_rows
    except ImportError:
        return np.array([n], dtype=np.int64)
    return virtual_shard_rows(n)


class Replayer:
    """Expected ids of ``(segment header, epoch, step, rank)``, with orders cached per epoch."""

    def __init__(self, shard_rows: np.ndarray) -> None:
        self.shard_rows = shard_rows
        self._orders: dict[tuple[Any, ...], EpochOrder] = {}

    def _order(self, header: dict[str, Any], epoch: int) -> EpochOrder:
        key = (header["fingerprint"], int(header["seed"]), epoch,
               tuple(sorted(header.get("order", {}).items())))
        order = self._orders.get(key)
        if order is None:
            if len(self._orders) > 8:
                self._orders.clear()
            order = EpochOrder(self.shard_rows, header["fingerprint"], int(header["seed"]), epoch,
                               OrderOptions.from_dict(dict(header.get("order", {}))))
            self._orders[key] = order
        return order

    def expected(self, header: dict[str, Any], epoch: int, step: int, rank: int) -> np.ndarray:
        return rank_batch_ids(self._order(header, epoch), plan_of(header, rank), step)

    def expected_steps(self, header: dict[str, Any], epoch: int, rank: int, first: int,
                       stop: int) -> list[np.ndarray]:
        """Expected ids of steps ``[first, stop)`` from one ``rank_ids`` call, split per step.

        A rank's positions in consecutive global batches are contiguous in ``k``, so one range
        evaluation covers them all; this is what keeps the audit at a few microseconds a step.
        """
        plan = plan_of(header, rank)
        if not 0 <= first < stop <= plan.steps_per_epoch:
            raise IndexError(f"steps [{first}, {stop}) outside the epoch's "
                             f"{plan.steps_per_epoch} steps")
        start, end = plan.window(first)[0], plan.window(stop - 1)[1]
        ids = self._order(header, epoch).rank_ids(start, end, rank, plan.world_size)
        base = plan.samples_before(first)
        bounds = [plan.samples_before(s) - base for s in range(first, stop + 1)]
        return [ids[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


_CHUNK_STEPS = 4096


def _runs(recs: np.ndarray) -> list[tuple[int, int]]:
    """``[lo, hi)`` record ranges of one file, segment, epoch and rank with consecutive steps."""
    if not len(recs):
        return []
    brk = np.ones(len(recs), dtype=bool)
    same = np.ones(len(recs) - 1, dtype=bool)
    for name in ("file", "seg", "epoch", "rank"):
        same &= recs[name][1:] == recs[name][:-1]
    brk[1:] = ~(same & (recs["step"][1:] == recs["step"][:-1] + 1))
    starts = np.flatnonzero(brk).tolist() + [len(recs)]
    out = []
    for lo, hi in zip(starts[:-1], starts[1:]):
        out += [(a, min(a + _CHUNK_STEPS, hi)) for a in range(lo, hi, _CHUNK_STEPS)]
    return out


def replay_check(run: Run, view: DatasetView) -> tuple[Check, np.ndarray | None]:
    """Compare every recorded step with the replay; returns the check and a per-record match."""
    if view.shard_rows is None:
        status = "fail" if view.changed else "skip"
        return Check("replay", status, view.problem or "not replayable",
                     {"dataset": view.location}), None
    replayer = view.replayer()
    recs = run.records
    match = np.zeros(len(recs), dtype=bool)
    first: dict[str, Any] | None = None
    for lo, hi in _runs(recs):
        row = recs[lo]
        head = run.segment_header(int(row["file"]), int(row["seg"]))
        try:
            expected = replayer.expected_steps(head, int(row["epoch"]), int(row["rank"]),
                                               int(row["step"]), int(recs[hi - 1]["step"]) + 1)
        except (StokerError, ValueError, IndexError, KeyError, TypeError):
            expected = None  # judge the steps one by one to name the bad one
        for i in range(lo, hi):
            exp = expected[i - lo] if expected is not None else _one(replayer, run, recs[i])
            if isinstance(exp, str):
                if first is None:
                    first = {**_where(run, recs[i]), "error": exp}
                continue
            match[i] = len(exp) == int(recs[i]["count"]) and \
                ids_digest(exp) == int(recs[i]["digest"])
            if not match[i] and first is None:
                first = _mismatch(run, recs[i], exp)
    bad = int((~match).sum())
    details = {"steps": len(recs), "mismatched": bad, "dataset": view.location,
               "first_mismatch": first}
    if bad:
        where = f"epoch {first['epoch']} step {first['step']} rank {first['rank']}" if first else ""
        return Check("replay", "fail", f"{bad} of {len(recs)} steps differ from the replay; "
                     f"first at {where}", details), match
    return Check("replay", "pass", f"all {len(recs)} steps match the replayed order",
                 details), match


def _one(replayer: Replayer, run: Run, row: np.void) -> np.ndarray | str:
    """Expected ids of one record, or why the order cannot have that step."""
    head = run.segment_header(int(row["file"]), int(row["seg"]))
    try:
        return replayer.expected(head, int(row["epoch"]), int(row["step"]), int(row["rank"]))
    except (StokerError, ValueError, IndexError, KeyError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"


def _where(run: Run, row: np.void) -> dict[str, Any]:
    return {"epoch": int(row["epoch"]), "step": int(row["step"]), "rank": int(row["rank"]),
            "file": run.ledgers[int(row["file"])].path}


def _mismatch(run: Run, row: np.void, expected: np.ndarray) -> dict[str, Any]:
    got = run.record_ids(row)
    out: dict[str, Any] = {
        **_where(run, row),
        "expected_count": len(expected), "consumed_count": int(row["count"]),
        "expected_digest": f"{ids_digest(expected):016x}",
        "consumed_digest": f"{int(row['digest']):016x}",
        "expected_ids": expected[:_SHOWN_IDS].tolist(),
    }
    if got is not None:
        out["consumed_ids"] = got[:_SHOWN_IDS].tolist()
        out["missing_ids"] = np.setdiff1d(expected, got)[:_SHOWN_IDS].tolist()
        out["unexpected_ids"] = np.setdiff1d(got, expected)[:_SHOWN_IDS].tolist()
        diff = np.flatnonzero(expected != got) if len(got) == len(expected) else None
        if diff is not None and diff.size:
            out["differing_positions"] = diff[:_SHOWN_IDS].tolist()
    return out
