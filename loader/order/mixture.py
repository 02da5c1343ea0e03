"""``Mixture``: stoker datasets blended by weight, with exact proportions in every prefix.

A mixture names its sources (datasets), their weights (normalised; default proportional to
size) and optionally a piecewise-constant *schedule* of weights over global sample positions
(a curriculum). Position ``k`` of the mixture's stream is served by the source the blend
(:mod:`stoker.loader.order.blend`) assigns to ``k``; that source's ``j``-th pick is sample
``j mod N_i`` of its own pass ``j div N_i``, in its own stoker order for (its fingerprint, the
loader's seed, that pass) (:mod:`stoker.loader.order.mixture_order`). Read it with
``DataLoader(Mixture(...))`` or ``DataLoader("path/to/mixture.json")``.

``mixture.json`` (``"format": "stoker-mixture/1"``)::

    {"format": "stoker-mixture/1",
     "sources": {"web": "web/", "code": "../code", "books": "s3://bucket/books"},
     "weights": {"web": 0.7, "code": 0.2, "books": 0.1},
     "schedule": [[1000000, {"web": 0.5, "code": 0.3, "books": 0.2}]]}

Relative source paths resolve against the file's directory. ``schedule`` entries are
``[position, weights]``: from that global position on, those weights apply (each entry names
every source); an entry at position 0 replaces ``weights``.

A mixture's *epoch* (what ``len(loader)`` counts) is ``sum(N_i)`` positions of the stream,
which continues across epochs; with the default weights one epoch reads every sample of
every source exactly once.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Sequence

import numpy as np

from stoker.loader.order.blend import BLEND_ALGORITHM, Blend, BlendError, exact_weight
from stoker.loader.order.mixture_file import MIXTURE_FORMAT
from stoker.loader.order.mixture_order import MIXTURE_ORDER
from stoker.manifest import Manifest, ManifestError, canonical_json, hash_bytes, is_url, redact_url

__all__ = ["Mixture", "MixtureError"]



class MixtureError(ManifestError):
    """A mixture that cannot be read: bad weights or schedule, an empty or unknown source, a
    malformed ``mixture.json``, or sources that disagree on a requested column."""


class Mixture:
    """Datasets blended by weight (see the module docstring).

    Args:
        sources: name -> dataset path/URL, or a loaded :class:`~stoker.manifest.Manifest`.
        weights: name -> positive number (normalised); default proportional to size.
        schedule: ``[(position, weights), ...]`` with increasing positions; from each position
            on its weights (name -> positive number, every source named) apply.
        storage_options: fsspec options for remote sources.

    Attributes:
        names: the sources' order; ``batch["source"]`` indexes it.
        manifests: the sources' manifests, in ``names`` order.
        sizes: samples per source.
        blend: the position -> (source, pick) rule.
        fingerprint: xxh3-128 of the names, the sources' fingerprints, the exact weights and
            the rule of the sources' order options (``MIXTURE_ORDER``).
    """

    def __init__(self, sources: Mapping[str, Any], weights: Mapping[str, Any] | None = None,
                 schedule: Sequence[tuple[int, Mapping[str, Any]]] | None = None, *,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        if not isinstance(sources, Mapping) or not sources:
            raise MixtureError(f"sources must be a non-empty mapping name -> dataset, got "
                               f"{type(sources).__name__}: {sources!r:.200}")
        self.names: tuple[str, ...] = tuple(str(n) for n in sources)
        self.manifests = tuple(_load(n, d, storage_options) for n, d in sources.items())
        self.sizes = tuple(int(m.num_samples) for m in self.manifests)
        for name, size in zip(self.names, self.sizes):
            if size == 0:
                raise MixtureError(f"source {name!r} holds no samples; a mixture cannot draw "
                                   "from it. Drop it from the mixture.")
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        segments = self._segments(weights, schedule)
        self.blend = Blend(segments)
        self.schedule = tuple((int(s), dict(zip(self.names, ws)))
                              for s, ws in zip(self.blend.starts, self.blend.weights))
        ident = {"algorithm": BLEND_ALGORITHM, "order": MIXTURE_ORDER,
                 "sources": [[n, m.fingerprint] for n, m in zip(self.names, self.manifests)],
                 "segments": self.blend.to_dict()["segments"]}
        self.fingerprint = hash_bytes(canonical_json(ident))

    # -- construction ---------------------------------------------------------------------------
    def _weights(self, given: Any, where: str) -> list[Any]:
        if not isinstance(given, Mapping):
            raise MixtureError(f"{where} must be a mapping name -> weight, got "
                               f"{type(given).__name__}")
        unknown = [n for n in given if n not in self.names]
        if unknown:
            raise MixtureError(f"{where} names {unknown[0]!r}, which is not a source of this "
                               f"mixture; its sources are {list(self.names)}.")
        missing = [n for n in self.names if n not in given]
        if missing:
            raise MixtureError(f"{where} lacks a weight for {missing}; give every source a "
                               "positive weight (drop a source to leave it out).")
        try:
            return [exact_weight(given[n], f"{where}[{n!r}]") for n in self.names]
        except BlendError as exc:
            raise MixtureError(str(exc)) from None

    def _segments(self, weights: Any, schedule: Any) -> list[tuple[int, list[Any]]]:
        entries = [] if schedule is None else list(schedule)
        out = []
        for e, entry in enumerate(entries):
            if not (isinstance(entry, (tuple, list)) and len(entry) == 2):
                raise MixtureError(f"schedule[{e}] must be (position, weights), got {entry!r:.120}")
            pos, ws = entry
            if isinstance(pos, bool) or not isinstance(pos, (int, np.integer)) or pos < 0:
                raise MixtureError(f"schedule[{e}] position {pos!r} must be an int >= 0")
            if out and pos <= out[-1][0]:
                raise MixtureError(f"schedule positions must increase: schedule[{e}] is at "
                                   f"{pos}, after {out[-1][0]}. Sort the entries, one per "
                                   "position.")
            out.append((int(pos), self._weights(ws, f"schedule[{e}] weights")))
        if out and out[0][0] == 0:
            if weights is not None:
                raise MixtureError("weights= and a schedule entry at position 0 both set the "
                                   "starting weights; give them once.")
            return out
        first = self._weights(weights, "weights") if weights is not None else list(self.sizes)
        return [(0, first)] + out

    @classmethod
    def load(cls, path: str | os.PathLike[str],
             storage_options: Mapping[str, Any] | None = None) -> "Mixture":
        """Read a ``mixture.json`` (see the module docstring)."""
        path = os.fspath(path)
        try:
            with open(path, "rb") as f:
                doc = json.load(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise MixtureError(f"{path}: cannot read the mixture ({type(exc).__name__}: {exc}); "
                               f"write it as JSON with 'sources' and 'weights'.") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("sources"), dict):
            raise MixtureError(f"{path}: a mixture file is a JSON object with 'sources' "
                               "(name -> dataset path)")
        if doc.get("format", MIXTURE_FORMAT) != MIXTURE_FORMAT:
            raise MixtureError(f"{path}: format {doc['format']!r} is not {MIXTURE_FORMAT!r}")
        unknown = sorted(set(doc) - {"format", "sources", "weights", "schedule"})
        if unknown:
            raise MixtureError(f"{path}: unknown key(s) {unknown}; a mixture has format, "
                               "sources, weights and schedule")
        base = os.path.dirname(os.path.abspath(path))
        sources = {n: _resolve(base, d, path) for n, d in doc["sources"].items()}
        return cls(sources, doc.get("weights"), doc.get("schedule"),
                   storage_options=storage_options)

    # -- description ----------------------------------------------------------------------------
    @property
    def num_samples(self) -> int:
        """Positions per loader epoch: the sum of the sources' sizes."""
        return int(self.offsets[-1])

    @property
    def weights(self) -> dict[str, Any]:
        """Exact normalised starting weights (``fractions.Fraction``) by name."""
        return dict(self.schedule[0][1])

    def describe(self) -> dict[str, Any]:
        """JSON-plain: what the ledger header and ``stoker inspect`` record of the mixture."""
        return {"format": MIXTURE_FORMAT, "fingerprint": self.fingerprint,
                "names": list(self.names),
                "sources": [{"name": n, "dataset": redact_url(m.root or ""),
                             "fingerprint": m.fingerprint, "samples": s}
                            for n, m, s in zip(self.names, self.manifests, self.sizes)],
                "blend": self.blend.to_dict()}

    def __repr__(self) -> str:
        shares = ", ".join(f"{n}={float(w):.4g}" for n, w in self.weights.items())
        return f"Mixture({shares}; {len(self.schedule)} segment(s), {self.num_samples} samples)"


def _load(name: Any, dataset: Any, storage_options: Mapping[str, Any] | None) -> Manifest:
    if isinstance(dataset, Manifest):
        return dataset
    if not isinstance(dataset, (str, os.PathLike)):
        raise MixtureError(f"source {name!r}: expected a dataset path/URL or a Manifest, got "
                           f"{type(dataset).__name__}")
    try:
        return Manifest.load(os.fspath(dataset), storage_options)
    except ManifestError as exc:
        raise MixtureError(f"source {name!r}: {exc}") from None


def _resolve(base: str, dataset: Any, path: str) -> str:
    if not isinstance(dataset, str) or not dataset:
        raise MixtureError(f"{path}: every source is a dataset path or URL (a string), got "
                           f"{dataset!r}")
    return dataset if is_url(dataset) or os.path.isabs(dataset) else os.path.join(base, dataset)
