"""The name of one batch on the wire: ``stoker.batch-key/1`` (the data service's request).

A batch of a stoker dataset is a pure function of its key, so any server holding the dataset
computes any key and a client can send the same key to another server after a failure. The key
is UTF-8 JSON with sorted keys and no spaces (one canonical byte string per key):

    {"batch_size": 1024, "dataset": "<fingerprint>", "drop_last": false, "epoch": 1,
     "format": "stoker.batch-key/1", "order": {"algorithm": ..., "shuffle": true, ...},
     "rank": 0, "read": {"categoricals": [], "columns": ["x", "label"], "features": [],
     "image": null}, "seed": 7, "step": 12, "transform": null, "world_size": 2}

``order`` is ``OrderOptions.to_dict()`` (resolved), ``read`` the read options the ledger's
content header records (stoker.loader.ledger.digest), ``batch_size`` the per-rank batch size
(global batch = batch_size x world_size, as in the loader), ``transform`` the name
``"module:function"`` of a server-side transform or ``null``. The ids of the batch are
``rank_batch_ids(EpochOrder(...), BatchPlan(...), step)``, exactly as the local loader reads
them (:func:`BatchKey.ids`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from stoker.loader.fastpath.images import ImageOptions
from stoker.loader.order.epoch import EpochOrder, OrderOptions
from stoker.loader.order.schedule import BatchPlan, rank_batch_ids
from stoker.manifest import StokerError

__all__ = ["KEY_FORMAT", "BatchKey", "BatchKeyError", "image_options"]

KEY_FORMAT = "stoker.batch-key/1"
_MAX_KEY_BYTES = 1 << 16
_INTS = ("seed", "epoch", "step", "rank", "world_size", "batch_size")
_READ = ("columns", "features", "categoricals", "image")


class BatchKeyError(StokerError, ValueError):
    """A batch key is malformed: not JSON, another format, a field missing or of the wrong
    type. The message names the field, the value and what it must be."""


@dataclass(frozen=True, slots=True)
class BatchKey:
    """One batch of one rank: everything the batch's bytes depend on."""

    dataset: str
    order: Mapping[str, Any]
    read: Mapping[str, Any]
    seed: int
    epoch: int
    step: int
    rank: int
    world_size: int
    batch_size: int
    drop_last: bool
    transform: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.dataset, str) or not self.dataset:
            _bad("dataset", self.dataset, "the dataset's fingerprint (a non-empty string)")
        for name in _INTS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                _bad(name, value, "an int")
        for name in ("epoch", "step", "rank"):
            if getattr(self, name) < 0:
                _bad(name, getattr(self, name), "an int >= 0")
        if self.world_size < 1 or self.rank >= self.world_size:
            _bad("rank", self.rank, f"an int in [0, world_size={self.world_size})")
        if self.batch_size < 1:
            _bad("batch_size", self.batch_size, "an int >= 1 (the per-rank batch size)")
        if not isinstance(self.drop_last, bool):
            _bad("drop_last", self.drop_last, "true or false")
        if self.transform is not None and (not isinstance(self.transform, str)
                                           or ":" not in self.transform):
            _bad("transform", self.transform, "null or a name 'module:function'")
        if not isinstance(self.order, Mapping):
            _bad("order", self.order, "OrderOptions.to_dict()")
        self._check_read()

    def _check_read(self) -> None:
        read = self.read
        if not isinstance(read, Mapping) or sorted(read) != sorted(_READ):
            _bad("read", read, f"a dict with exactly the keys {list(_READ)}")
        for name in ("columns", "features", "categoricals"):
            names = read[name]
            if not isinstance(names, list) or not all(isinstance(c, str) for c in names):
                _bad(f"read.{name}", names, "a list of column names")
        if read["image"] is not None and not isinstance(read["image"], Mapping):
            _bad("read.image", read["image"], "null or the image options as a dict")

    # -- wire form -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"format": KEY_FORMAT, "dataset": self.dataset, "order": dict(self.order),
                "read": dict(self.read), "seed": self.seed, "epoch": self.epoch,
                "step": self.step, "rank": self.rank, "world_size": self.world_size,
                "batch_size": self.batch_size, "drop_last": self.drop_last,
                "transform": self.transform}

    def encode(self) -> bytes:
        """The canonical bytes of this key (sorted keys, no spaces)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "BatchKey":
        """Parse and validate a key; :class:`BatchKeyError` names what is wrong."""
        if len(raw) > _MAX_KEY_BYTES:
            raise BatchKeyError(f"batch key of {len(raw)} bytes; a {KEY_FORMAT} key is at most "
                                f"{_MAX_KEY_BYTES} bytes. Send BatchKey.encode()'s bytes.")
        try:
            d = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BatchKeyError(f"batch key is not UTF-8 JSON ({exc}); send "
                                "BatchKey.encode()'s bytes.") from None
        if not isinstance(d, dict) or d.get("format") != KEY_FORMAT:
            got = d.get("format") if isinstance(d, dict) else type(d).__name__
            raise BatchKeyError(f"batch key format {got!r}; this server reads {KEY_FORMAT!r} "
                                "(client and server must run compatible stoker versions).")
        fields = set(cls.__dataclass_fields__)
        missing = sorted(fields - set(d))
        unknown = sorted(set(d) - fields - {"format"})
        if missing or unknown:
            raise BatchKeyError(f"batch key fields: missing {missing}, unknown {unknown}; a "
                                f"{KEY_FORMAT} key has exactly {sorted(fields)}.")
        return cls(**{name: d[name] for name in fields})

    # -- what the key means --------------------------------------------------------------
    def order_options(self) -> OrderOptions:
        try:
            return OrderOptions.from_dict(dict(self.order))
        except StokerError as exc:
            raise BatchKeyError(f"batch key field order: {exc}") from None

    def plan(self, num_samples: int) -> BatchPlan:
        return BatchPlan(num_samples, self.batch_size * self.world_size, self.world_size,
                         self.rank, self.drop_last)

    def ids(self, order: EpochOrder) -> np.ndarray:
        """The global sample ids of this batch (int64), as the local loader reads them."""
        plan = self.plan(order.num_samples)
        if self.step >= plan.steps_per_epoch:
            raise BatchKeyError(f"batch key step={self.step} is past the epoch's "
                                f"{plan.steps_per_epoch} steps (batch_size={self.batch_size}, "
                                f"world_size={self.world_size}, drop_last={self.drop_last}).")
        return rank_batch_ids(order, plan, self.step)


def image_options(read: Mapping[str, Any]) -> ImageOptions | None:
    """The :class:`ImageOptions` of a key's ``read.image`` (the inverse of the content
    header's image dict)."""
    d = read.get("image")
    if d is None:
        return None
    try:
        norm = d.get("normalize")
        return ImageOptions(
            column=d["column"], size=tuple(d["size"]),
            crop=None if d.get("crop") is None else tuple(d["crop"]),
            ratio=tuple(d["ratio"]), flip=bool(d["flip"]),
            normalize=None if norm is None else (tuple(norm[0]), tuple(norm[1])),
            output=d["output"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BatchKeyError(f"batch key field read.image={dict(d)!r}: {exc}; expected the "
                            "content header's image options.") from None


def _bad(field: str, value: Any, want: str) -> None:
    raise BatchKeyError(f"batch key field {field}={value!r}: must be {want}.")
