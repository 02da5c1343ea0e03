"""Content of a run over a mixture: every step's merged batch rebuilt from its sources.

A mixture run's ledger records, per step, content digests of the merged batch as delivered
(one per column, plus ``"source"``) and the read options its sources' readers shared
(:func:`stoker.loader.ledger.digest.content_header`). The check replays each step's mixture
ids (:class:`~stoker.tools.audit.mixture.MixtureReplayer`), splits them by source, reads each
source's rows with the reference reader of the single-dataset check (pyarrow path, no
kernels, records or cache) from that source's own shards, each re-hashed against its manifest
before it is read, merges them back in stream order
(:class:`~stoker.loader.read.mixture.MixtureSource` with one reader per
source even where the loader read every source through one) and compares digests, exactly
as :func:`stoker.tools.audit.content.content_check` does for one dataset: the first wrong step
is named with its rank and column, and with how many of its rows each source gave.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stoker.loader.order.mixture import Mixture
from stoker.loader.read.mixture import MixtureSource, reader_manifests
from stoker.manifest import Manifest, is_url, redact_url
from stoker.tools.audit.content import (VerifiedShards, check_fraction, digests_recorded,
                                        rebuild_check, reference_reader)
from stoker.tools.audit.mixture import MixtureView
from stoker.tools.audit.report import Check
from stoker.tools.audit.run import Run

__all__ = ["mixture_content_check"]


def mixture_content_check(run: Run, view: MixtureView, sample: float = 1.0) -> Check:
    """Rebuild the sampled steps' merged batches from the sources' verified shards and
    compare digests (the ``content`` check of a mixture run)."""
    check_fraction(sample)
    skip = _skip_reason(run, view)
    if skip is not None:
        return Check("content", "fail" if view.changed else "skip", skip,
                     {"dataset": view.location})
    mixture = view.mixture
    assert mixture is not None  # noqa: S101 - see _skip_reason
    openers: list[VerifiedShards] = []

    def source(read: dict[str, Any]) -> MixtureSource:
        def reader(manifest: Manifest) -> tuple[Any, None]:
            opener = VerifiedShards(manifest)
            openers.append(opener)
            return reference_reader(manifest, read, opener), None

        return MixtureSource(mixture, reader, ring_depth=2,
                             named=reader_manifests(mixture, union=False))

    return rebuild_check(run, view.location, sample, view.replayer(), source, openers,
                         describe=lambda ids: {"sources": _sources_of(mixture, ids)})


def _sources_of(mixture: Mixture, ids: np.ndarray) -> dict[str, int]:
    """How many of a step's rows each source gave (a mismatch names the sources involved)."""
    src = np.searchsorted(mixture.offsets, ids, side="right") - 1
    counts = np.bincount(src, minlength=len(mixture.names))
    return {name: int(n) for name, n in zip(mixture.names, counts.tolist()) if n}


def _skip_reason(run: Run, view: MixtureView) -> str | None:
    if not digests_recorded(run):
        return ("the ledger holds no content digests (written without them, or by a stoker "
                "older than the content check)")
    if view.mixture is None:
        return view.problem or "the mixture is not available; pass --dataset mixture.json"
    if not any(isinstance((seg.header.get("content") or {}).get("read"), dict)
               for led in run.ledgers for seg in led.segments if seg.content is not None):
        return ("the ledger's digests cover each merged batch as one value without the read "
                "options a rebuild needs (recorded by a stoker older than the mixture content "
                "check); the replay proves the ids")
    for name, manifest in zip(view.mixture.names, view.mixture.manifests):
        root = manifest.root or ""
        if is_url(root) and not root.startswith("file://"):
            return (f"source {name!r} is remote ({redact_url(root)}); pass --dataset path/to/mixture.json "
                    "naming local copies (verified against their manifests as they are read)")
    return None
