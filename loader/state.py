"""The loader's resumable state: a small dict of plain values, checked on load.

The state names a *global* position (epoch, global steps consumed), not a per-worker or
per-rank one, which is why it can be loaded with another ``num_workers`` or world size.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

from stoker.loader.errors import StateError
from stoker.loader.order.mixture_order import MIXTURE_ORDER

__all__ = ["STATE_FORMAT", "Cursor", "LoaderState"]

STATE_FORMAT = "stoker-loader/1"


@dataclass(frozen=True, slots=True)
class LoaderState:
    """Where a run is: enough to recompute every later batch and nothing more."""

    fingerprint: str
    kind: str
    num_samples: int
    seed: int
    epoch: int
    step: int
    global_batch: int
    drop_last: bool
    order: Mapping[str, Any]
    world_size: int
    rank: int
    mode: str  # "order" (stoker order contract) or "sampler" (user's sampler/batch_sampler)
    ahead: tuple[int, ...] = ()  # steps past ``step`` already yielded (``in_order=False``)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["order"] = dict(self.order)
        d["ahead"] = list(self.ahead)
        return {"format": STATE_FORMAT, **d}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LoaderState":
        if not isinstance(d, Mapping) or d.get("format") != STATE_FORMAT:
            got = d.get("format") if isinstance(d, Mapping) else type(d).__name__
            raise StateError(f"not a stoker loader state (format={got!r}, expected "
                             f"{STATE_FORMAT!r}); pass the dict returned by state_dict().")
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in d and n != "ahead"]
        if missing:
            raise StateError(f"loader state lacks {missing}; pass the dict returned by "
                             "state_dict() unchanged.")
        return cls(**{n: d[n] for n in names if n in d and n != "ahead"},
                   ahead=tuple(int(s) for s in d.get("ahead", ())))

    def check_compatible(self, current: "LoaderState") -> None:
        """Raise StateError unless this saved state can continue in ``current``'s loader."""
        if self.fingerprint != current.fingerprint:
            why = ("" if current.kind != "mixture" else
                   " A mixture's fingerprint also covers the rule its sources' order options "
                   f"follow, now {MIXTURE_ORDER!r} (each source takes a share of the partitions "
                   "in proportion to its size): a state saved under an earlier rule cannot "
                   "continue.")
            raise StateError(f"the state was saved for dataset fingerprint {self.fingerprint!r}, "
                             f"but this loader reads {current.fingerprint!r}; load it into a "
                             f"loader over the same dataset.{why}")
        for name, why in (("kind", "dataset kind"), ("mode", "ordering mode (sampler vs order)"),
                          ("num_samples", "number of samples"), ("drop_last", "drop_last"),
                          ("global_batch", "global batch size (batch_size x world_size)")):
            saved, now = getattr(self, name), getattr(current, name)
            if saved != now:
                raise StateError(f"incompatible state: {why} was {saved!r} when saved and is "
                                 f"{now!r} now; create the loader with the saved settings.")
        if dict(self.order) != dict(current.order):
            diff = {k: (self.order.get(k), current.order.get(k))
                    for k in set(self.order) | set(current.order)
                    if self.order.get(k) != current.order.get(k)}
            saved = dict(self.order)
            raise StateError(
                f"incompatible state: order options differ (saved, now): {diff}; create the "
                f"loader with the saved options: shuffle={saved.get('shuffle')}, partitions="
                f"{saved.get('partitions')}, block_size={saved.get('block_size')}, "
                f"partition_mode={saved.get('partition_mode')!r}. (stoker 0.1's defaults changed "
                "after states were first written: partitions are now chosen from the order's "
                "working set and block_size defaults to 1024, and a mixture's partitions fit "
                "the staging of all its sources together, so a state saved with the old "
                "defaults continues only with those options passed explicitly.)")


@dataclass(slots=True)
class Cursor:
    """Where a loader stands now: the epoch it reads, the first step of that epoch not yet
    yielded, and the steps yielded ahead of it (``in_order=False``). The DataLoader owns it,
    an epoch's pass moves it as it yields batches, ``state_dict()`` reads it."""

    epoch: int = 0
    step: int = 0
    ahead: set[int] = field(default_factory=set)

    def start_epoch(self, epoch: int) -> None:
        self.epoch, self.step, self.ahead = epoch, 0, set()

    def advance(self, step: int) -> None:
        """Record ``step`` as yielded; the position stays at the first step not yet yielded."""
        if step != self.step:
            self.ahead.add(step)
            return
        self.step = step + 1
        while self.step in self.ahead:
            self.ahead.discard(self.step)
            self.step += 1
