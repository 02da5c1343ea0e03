"""The part of the DataLoader that saves and loads its position (``state_dict()``).

The state names a global position (epoch, steps consumed; see ``stoker.loader.state``), so it
loads with another ``num_workers`` or world size; an IterableDataset's state is its workers'
dataset states (``stoker.loader.iterable``).
"""

from __future__ import annotations

from typing import Any, Mapping

from stoker.loader.errors import StateError
from stoker.loader.iterable import iterable_state, load_iterable_state
from stoker.loader.state import Cursor, LoaderState

__all__ = ["Resumable"]


class Resumable:
    """Mixin of :class:`~stoker.loader.dataloader.DataLoader`: state_dict / load_state_dict."""

    _cursor: Cursor
    _mode: str
    _source: Any
    _active: Any
    _ledger: Any
    _loaded: LoaderState | None
    _resumed_from: dict[str, Any] | None
    seed: int
    drop_last: bool
    order_options: Any

    def _position(self) -> tuple[int, int]:
        """(epoch, step); "after the last batch of epoch e" is reported as (e + 1, 0)."""
        steps = len(self)
        cursor = self._cursor
        if steps and cursor.step >= steps:
            return cursor.epoch + 1, 0
        return cursor.epoch, cursor.step

    def _state(self) -> LoaderState:
        epoch, step = self._position()
        plan = self._configured()
        return LoaderState(
            fingerprint=self._source.fingerprint, kind=self._source.kind,
            num_samples=plan.num_samples, seed=self.seed, epoch=epoch,
            step=step, global_batch=plan.global_batch, drop_last=self.drop_last,
            order=self.order_options.to_dict(), world_size=plan.world_size, rank=plan.rank,
            mode=self._mode, ahead=tuple(sorted(self._cursor.ahead)) if step == self._cursor.step else ())

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch yielded: JSON-plain, small."""
        if self._mode == "iterable":
            return iterable_state(self)
        return self._state().to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``: the next batch is the one after the state's last batch."""
        if self._mode == "iterable":
            return load_iterable_state(self, state)
        saved = LoaderState.from_dict(state)
        saved.check_compatible(self._state())
        if self._active is not None:
            self._active.close()
        self.seed = saved.seed
        self._cursor.start_epoch(saved.epoch)
        self._cursor.step = saved.step
        if saved.step > len(self):
            raise StateError(f"state step {saved.step} is past the end of the epoch "
                             f"({len(self)} steps); the state does not belong to this loader.")
        epoch, step = self._position()
        self._cursor.start_epoch(epoch)
        self._cursor.step, self._cursor.ahead = step, set(saved.ahead)
        self._loaded = saved
        if self._ledger is not None:
            self._ledger.event("resume", state=saved.to_dict())
        else:  # written when the ledger opens, at the next iteration
            self._resumed_from = saved.to_dict()
