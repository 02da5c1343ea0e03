"""The sample order of a mixture: loader epoch ``e``, position ``k`` -> a mixture sample id.

A mixture sample id is ``offset_i + id``: sample ``id`` of source ``i``, whose ids start at
``offset_i = N_0 + ... + N_{i-1}`` (the sources' samples concatenated in ``Mixture.names``
order). Epoch ``e`` covers global stream positions ``[e * L, (e + 1) * L)`` with
``L = sum N_i``; position ``g`` is pick ``j`` of source ``i`` by the blend, and that pick is
``EpochOrder(source i, seed, epoch=j div N_i).ids_at(j mod N_i)``: each pass of a source is
its own permutation, a new pass a new one. Ranks take positions ``k % world_size == rank`` of
each global batch, as for one dataset, so the union of the ranks' batches is the global batch
whatever the world size.

:class:`MixtureOrder` has the surface of :class:`~stoker.loader.order.EpochOrder` that the
loader, its samplers and the audit use (``num_samples``, ``ids``, ``ids_at``, ``rank_ids``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from stoker.loader.order import EpochOrder, OrderError, OrderOptions

__all__ = ["MixtureOrder", "PassOrders", "source_order"]


class PassOrders:
    """The per-pass orders of a mixture's sources, built on demand and kept (a few)."""

    def __init__(self, shard_rows: list[np.ndarray], fingerprints: list[str], seed: int,
                 options: OrderOptions, keep: int = 64) -> None:
        self._rows, self._fps, self.seed, self.options = shard_rows, fingerprints, seed, options
        self._keep = keep
        self._cache: OrderedDict[tuple[int, int], EpochOrder] = OrderedDict()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_cache", "_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._cache, self._lock = OrderedDict(), threading.Lock()

    def get(self, source: int, pass_: int) -> EpochOrder:
        key = (source, pass_)
        with self._lock:
            order = self._cache.get(key)
            if order is not None:
                self._cache.move_to_end(key)
                return order
        order = EpochOrder(self._rows[source], self._fps[source], self.seed, pass_, self.options)
        with self._lock:
            self._cache[key] = order
            while len(self._cache) > self._keep:
                self._cache.popitem(last=False)
        return order

    def ids(self, src: np.ndarray, pick: np.ndarray, sizes: np.ndarray,
            offsets: np.ndarray) -> np.ndarray:
        """Mixture ids of the picks ``(src, pick)`` (int64, same length)."""
        out = np.empty(len(src), dtype=np.int64)
        passes = pick // sizes[src]
        within = pick - passes * sizes[src]
        key = src * (int(passes.max()) + 1 if len(passes) else 1) + passes
        for k in np.unique(key).tolist():
            sel = np.flatnonzero(key == k)
            i, p = int(src[sel[0]]), int(passes[sel[0]])
            out[sel] = offsets[i] + self.get(i, p).ids_at(within[sel])
        return out


class MixtureOrder:
    """``O[k]`` for ``k`` in ``[0, L)`` of one loader epoch of a mixture (random access).

    Args:
        mixture: the :class:`~stoker.loader.mixture.Mixture` (its blend and sizes).
        passes: the sources' pass orders (seed and order options inside).
        epoch: the loader epoch.
    """

    def __init__(self, mixture: Any, passes: PassOrders, epoch: int) -> None:
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise OrderError(f"epoch must be an int >= 0, got {epoch!r}")
        self.mixture, self.passes, self.epoch = mixture, passes, int(epoch)
        self.num_samples = mixture.num_samples
        self.options = passes.options
        self.seed = passes.seed
        self.fingerprint = mixture.fingerprint
        self._sizes = np.asarray(mixture.sizes, dtype=np.int64)
        self._base = self.epoch * self.num_samples

    def __repr__(self) -> str:
        return f"MixtureOrder(epoch={self.epoch}, num_samples={self.num_samples}, {self.mixture})"

    def _check_window(self, start: int, stop: int) -> tuple[int, int]:
        start, stop = int(start), int(stop)
        if not 0 <= start <= stop <= self.num_samples:
            raise OrderError(f"positions [start, stop) = [{start}, {stop}) must satisfy "
                             f"0 <= start <= stop <= num_samples = {self.num_samples}.")
        return start, stop

    def sources(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """(source, pick) of positions ``[start, stop)`` of this epoch."""
        start, stop = self._check_window(start, stop)
        return self.mixture.blend.picks(self._base + start, self._base + stop)

    def _ids(self, src: np.ndarray, pick: np.ndarray) -> np.ndarray:
        return self.passes.ids(src, pick, self._sizes, self.mixture.offsets)

    def ids(self, start: int, stop: int) -> np.ndarray:
        """Mixture ids ``O[start:stop]`` (int64)."""
        return self._ids(*self.sources(start, stop))

    def rank_ids(self, start: int, stop: int, rank: int, world_size: int) -> np.ndarray:
        """``[O[k] for k in range(start, stop) if k % world_size == rank]``."""
        if world_size < 1 or not 0 <= rank < world_size:
            raise OrderError(f"rank must be in [0, world_size={world_size}), got {rank}.")
        start, stop = self._check_window(start, stop)
        first = start + (rank - start) % world_size
        if first >= stop:
            return np.empty(0, dtype=np.int64)
        src, pick = self.sources(first, stop)
        return self._ids(src[::world_size], pick[::world_size])

    def ids_at(self, ks: np.ndarray) -> np.ndarray:
        """``O[k]`` for arbitrary positions (one blend window over their range)."""
        ks = np.asarray(ks, dtype=np.int64)
        if not ks.size:
            return np.empty(ks.shape, dtype=np.int64)
        lo, hi = int(ks.min()), int(ks.max()) + 1
        src, pick = self.sources(lo, hi)
        return self._ids(src[ks.ravel() - lo], pick[ks.ravel() - lo]).reshape(ks.shape)


def source_order(source: Any, seed: int, epoch: int, options: OrderOptions) -> Any:
    """The order a loader's source is read in: a mixture's own, else ``EpochOrder`` over its
    shards (what the epoch iterator, the samplers and the audit build)."""
    make = getattr(source, "epoch_order", None)
    if make is not None:
        return make(seed, epoch, options)
    return EpochOrder(source.shard_rows, source.fingerprint, seed, epoch, options)
