"""A loader may append to a ledger only where that ledger's run stands.

A ledger knows its history. A new loader that opens a ledger with progress and was not
resumed (``load_state_dict``) would record its steps again from its own start: the audit
would see a fresh start and count the earlier steps as rolled back, so a run that consumed 17
batches twice would still pass. So appending is refused unless

* the ledger holds no step yet, or
* the loader was resumed from a state (its ``"resume"`` event is audited: a gap or a jump
  after it fails the audit), or
* the loader starts exactly at the step after the ledger's last one (a new loader per epoch);

and, whatever the position, the ledger's run must be this run: same dataset fingerprint,
seed, order options and batch geometry.
"""

from __future__ import annotations

from typing import Any

from stoker.loader.ledger.writer import Progress
from stoker.loader.ledger.format import LedgerError

__all__ = ["IDENTITY_KEYS", "check_continues"]

IDENTITY_KEYS = ("fingerprint", "seed", "order", "num_samples", "global_batch", "drop_last",
                 "kind", "world_size", "rank")
"""Header keys that must match for a loader to append to a ledger's run."""


def check_continues(progress: Progress, header: dict[str, Any], start: tuple[int, int],
                    resumed: bool, steps_per_epoch: int | None, path: Any) -> None:
    """Raise :class:`LedgerError` unless a loader at ``start`` may append to this ledger
    (``steps_per_epoch`` ``None``: unknown, an iterable dataset's epoch may end anywhere)."""
    if progress.header is None or progress.last is None:
        return
    differs = [k for k in IDENTITY_KEYS if progress.header.get(k) != header.get(k)]
    if differs:
        k = differs[0]
        raise LedgerError(
            f"{path}: this ledger records another run ({k} {progress.header.get(k)!r}, this "
            f"loader has {header.get(k)!r}); appending would mix two runs in one proof. Pass a "
            "new ledger path for this run.")
    if resumed:
        return
    epoch, step = progress.last
    following = {(epoch + 1, 0)} if steps_per_epoch is None or step + 1 >= steps_per_epoch \
        else set()
    if steps_per_epoch is None or step + 1 < steps_per_epoch:
        following.add((epoch, step + 1))
    if tuple(start) in following:
        return
    raise LedgerError(
        f"{path}: the ledger's run has consumed up to epoch {epoch} step {step}, and this "
        f"loader would start at epoch {start[0]} step {start[1]} without having been resumed: "
        "its batches would be recorded as a restart over the ledger (steps seen twice or "
        "skipped). Call loader.load_state_dict(saved_state) before iterating to resume the "
        "run, or pass a new ledger path to start a new one.")
