"""Content: did every step deliver the bytes its samples hold in the dataset?

The replay proves the *ids* of each step; a node can still serve wrong *values* for the right
ids (stale or tampered derived records, a bad cache, a kernel bug). With a ledger the loader
records, per step and column, a digest of the batch as delivered
(:mod:`stoker.loader.ledger.digest`). This check rebuilds each step's batch from the
source of truth, the manifest's shards, each re-hashed against the manifest before it is read,
through the plain pyarrow path (no kernels, no row-major records, no cache), and compares the
digests. The first wrong step is named with its rank and column.

``sample`` (``stoker audit --sample 0.01``) checks a deterministic share of the steps (chosen
by a hash of epoch, step and rank, so two audits check the same steps) for very long runs.

:func:`rebuild_check` is the part shared with a mixture run's check
(:mod:`stoker.tools.audit.mixture_content`): it walks the ledger's steps, rebuilds each with the
reader it is given and compares digests; what differs is the replayer and the reader.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, Sequence

import numpy as np
import xxhash

from stoker.loader.ledger.digest import CONTENT_ALGORITHM, batch_digests
from stoker.loader.ledger.reader import content_columns
from stoker.manifest import (Manifest, ShardIntegrityError, StokerError, hash_file, is_url,
                             resolve_inside)
from stoker.tools.audit.replay import DatasetView, Replayer
from stoker.tools.audit.report import Check
from stoker.tools.audit.run import Run

__all__ = ["VerifiedShards", "check_fraction", "content_check", "digests_recorded",
           "rebuild_check", "reference_reader", "sampled"]


def sampled(epoch: int, step: int, rank: int, fraction: float) -> bool:
    """Whether the audit checks ``(epoch, step, rank)`` at ``fraction`` (deterministic)."""
    if fraction >= 1.0:
        return True
    h = xxhash.xxh3_64_intdigest(f"{epoch}:{step}:{rank}".encode())
    return h < fraction * 2.0 ** 64


class VerifiedShards:
    """Opens local shards for the rebuild, each re-hashed against the manifest first."""

    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest
        self.root = (manifest.root or ".").removeprefix("file://")
        self.checked: set[int] = set()

    def __call__(self, index: int) -> Any:
        shard = self.manifest.shards[index]
        path = resolve_inside(self.root, shard.path, f"shards[{index}].path")
        if index not in self.checked:
            digest, size = hash_file(path)
            if size != shard.bytes or digest != shard.xxh3_128:
                raise ShardIntegrityError(
                    f"shard {index} ({shard.path!r}) has {size} bytes, xxh3-128 {digest}; the "
                    f"manifest says {shard.bytes} bytes, {shard.xxh3_128}: the source of truth "
                    "is damaged, so the delivered content cannot be checked. Restore the shard "
                    "(`stoker verify`).", shard=shard.path)
            self.checked.add(index)
        return nullcontext(path)


def reference_reader(manifest: Manifest, read: dict[str, Any],
                     opener: Callable[[int], Any]) -> Any:
    """The plain reader a step's batch is rebuilt with (pyarrow path, no records), given the
    read options a ledger header records (:func:`stoker.loader.ledger.digest.content_header`)."""
    from stoker.loader.fastpath.images import ImageOptions

    image = read.get("image")
    opts = None if image is None else ImageOptions(
        column=image["column"], size=tuple(image["size"]),
        crop=None if image["crop"] is None else tuple(image["crop"]),
        ratio=tuple(image["ratio"]), flip=bool(image["flip"]),
        normalize=None if image["normalize"] is None else tuple(tuple(x) for x in
                                                                image["normalize"]),
        output=image["output"])
    kw: dict[str, Any] = dict(columns=read["columns"], features=read["features"] or None,
                              categoricals=read["categoricals"] or None, image=opts)
    if manifest.kind != "arrow":
        from stoker.loader.read.indexed.source import IndexSource

        return IndexSource(manifest, **kw)
    from stoker.loader.read.arrow import ArrowSource

    return ArrowSource(manifest, opener=opener, fast=False, row_major=False, **kw)


def check_fraction(sample: float) -> None:
    """Refuse a ``sample`` share outside (0, 1] (ValueError)."""
    if not 0.0 < sample <= 1.0:
        raise ValueError(f"sample must be in (0, 1], got {sample!r}")


def digests_recorded(run: Run) -> bool:
    """Whether any segment of ``run`` recorded content digests."""
    return any(seg.content is not None for led in run.ledgers for seg in led.segments)


def _skip_reason(run: Run, view: DatasetView) -> str | None:
    if not digests_recorded(run):
        return ("the ledger holds no content digests (written without them, or by a stoker "
                "older than the content check)")
    if run.header.get("kind") == "torch":
        return "a generic torch dataset has no manifest to rebuild its batches from"
    if view.manifest is None or view.shard_rows is None:
        return view.problem or "the dataset is not available; pass --dataset PATH"
    root = view.manifest.root or ""
    if is_url(root) and not root.startswith("file://"):
        return (f"the dataset at {view.location} is remote; pass --dataset PATH to a local "
                "copy (verified against the manifest as it is read)")
    return None


def content_check(run: Run, view: DatasetView, sample: float = 1.0) -> Check:
    """Rebuild the sampled steps' batches from the verified shards and compare digests."""
    check_fraction(sample)
    skip = _skip_reason(run, view)
    if skip is not None:
        return Check("content", "fail" if view.changed else "skip", skip,
                     {"dataset": view.location})
    manifest = view.manifest
    assert manifest is not None and view.shard_rows is not None  # noqa: S101 - see _skip_reason
    opener = VerifiedShards(manifest)
    return rebuild_check(run, view.location, sample, Replayer(view.shard_rows),
                         lambda read: reference_reader(manifest, read, opener), [opener])


def rebuild_check(run: Run, location: str | None, sample: float, replayer: Replayer,
                  make_source: Callable[[dict[str, Any]], Any],
                  openers: Sequence[VerifiedShards],
                  describe: Callable[[np.ndarray], dict[str, Any]] | None = None) -> Check:
    """The ``content`` check: every sampled step of ``run`` rebuilt and its digests compared.

    Args:
        run: the run.
        location: the dataset (or mixture) the check names.
        sample: share of the steps rebuilt (see :func:`sampled`).
        replayer: a step's expected ids.
        make_source: a reader for a segment's recorded read options (``fetch(ids, epoch,
            seed)``, ``close()``); one per distinct options, closed at the end.
        openers: the shard openers the readers verify through (read when the check ends:
            ``shards_verified``).
        describe: extra facts of a mismatched step from its ids (a mixture: its sources).
    """
    sources: dict[str, Any] = {}
    recorded = checked = 0
    bad: list[dict[str, Any]] = []
    unbuildable: list[dict[str, Any]] = []
    try:
        for led in run.ledgers:
            for si, seg in enumerate(led.segments):
                if seg.content is None or not len(seg.steps):
                    continue
                head = seg.header
                columns = content_columns(head)
                problem = _unbuildable_segment(head)
                if problem is not None:
                    recorded += len(seg.steps)
                    unbuildable.append({"file": led.path, "segment": si, "error": problem})
                    continue
                key = repr(head["content"]["read"])
                if key not in sources:
                    sources[key] = make_source(head["content"]["read"])
                source = sources[key]
                for i, rec in enumerate(seg.steps):
                    recorded += 1
                    epoch, step, rank = int(rec["epoch"]), int(rec["step"]), int(rec["rank"])
                    if not sampled(epoch, step, rank, sample):
                        continue
                    where = {"epoch": epoch, "step": step, "rank": rank, "file": led.path}
                    try:
                        ids = replayer.expected(head, epoch, step, rank)
                    except (StokerError, ValueError, IndexError, KeyError, TypeError) as exc:
                        unbuildable.append({**where, "error": f"{type(exc).__name__}: {exc}"})
                        continue
                    got = batch_digests(source.fetch(ids, epoch, int(head["seed"])), columns)
                    checked += 1
                    wrong = [c for c, a, b in zip(columns, got, seg.content[i]) if a != int(b)]
                    if wrong:
                        j = columns.index(wrong[0])
                        bad.append({**where, "columns": wrong, "column": wrong[0],
                                    "expected_digest": f"{got[j]:016x}",
                                    "delivered_digest": f"{int(seg.content[i][j]):016x}",
                                    "ids": ids[:16].tolist(),
                                    **(describe(ids) if describe is not None else {})})
    except ShardIntegrityError as exc:
        return Check("content", "fail", str(exc), {"dataset": location})
    finally:
        for source in sources.values():
            source.close()
    details = {"dataset": location, "steps_recorded": recorded, "steps_checked": checked,
               "mismatched": len(bad), "sample": sample, "unbuildable": unbuildable[:20],
               "shards_verified": sum(len(o.checked) for o in openers),
               "first_mismatch": bad[0] if bad else None, "mismatches": bad[:50]}
    share = "" if sample >= 1.0 else f" (sample {sample:g} of {recorded} recorded)"
    if unbuildable:
        share += f"; {len(unbuildable)} step(s) or segment(s) could not be rebuilt"
    if bad:
        b = bad[0]
        return Check("content", "fail",
                     f"{len(bad)} of {checked} steps checked delivered other bytes than the "
                     f"dataset holds; first at epoch {b['epoch']} step {b['step']} rank "
                     f"{b['rank']} column {b['column']!r}{share}", details)
    return Check("content", "pass", f"all {checked} steps checked delivered the dataset's "
                 f"bytes{share}", details)


def _unbuildable_segment(head: dict[str, Any]) -> str | None:
    """Why a segment's steps cannot be rebuilt (``None``: they can)."""
    algorithm = head["content"].get("algorithm")
    if algorithm != CONTENT_ALGORITHM:
        return f"digest algorithm {algorithm!r} is not {CONTENT_ALGORITHM!r}"
    if not isinstance(head["content"].get("read"), dict):
        return ("the segment records no read options to rebuild its batches with (a mixture "
                "run recorded by a stoker older than the mixture content check)")
    return None
