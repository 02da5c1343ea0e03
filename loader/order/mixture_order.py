"""The sample order of a mixture: loader epoch ``e``, position ``k`` -> a mixture sample id.

A mixture sample id is ``offset_i + id``: sample ``id`` of source ``i``, whose ids start at
``offset_i = N_0 + ... + N_{i-1}`` (the sources' samples concatenated in ``Mixture.names``
order). Epoch ``e`` covers global stream positions ``[e * L, (e + 1) * L)`` with
``L = sum N_i``; position ``g`` is pick ``j`` of source ``i`` by the blend, and that pick is
``EpochOrder(source i, seed, epoch=j div N_i, options_i).ids_at(j mod N_i)``: each pass of a
source is its own permutation, a new pass a new one. ``options_i`` are the loader's order
options with source ``i``'s share of the partitions (:func:`source_options`). Ranks take
positions ``k % world_size == rank`` of each global batch, as for one dataset, so the union
of the ranks' batches is the global batch whatever the world size.

:class:`MixtureOrder` has the surface of :class:`~stoker.loader.order.epoch.EpochOrder` that the
loader, its samplers and the audit use (``num_samples``, ``ids``, ``ids_at``, ``rank_ids``).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any, Sequence

import numpy as np

from stoker.loader.order.epoch import EpochOrder, OrderError, OrderOptions
from stoker.loader.order.mixture_kernel import pick_spans, place
from stoker.loader.order.options import check_window
from stoker.loader.order.windows import Ahead, ChunkThread, Windows

__all__ = ["MIXTURE_ORDER", "MixtureOrder", "PassOrders", "source_options", "source_order"]

# the rule that maps a mixture's order options to its sources' (source_options); part of a
# mixture's fingerprint, so a state or ledger written under another rule is refused
MIXTURE_ORDER = "stoker.mixture-order/2"

# positions per chunk: a mixture chunk calls a kernel per source and pass, each call a GIL
# hand-over for the order thread; W1 with 2 thread workers read 79-81 % of the single source's
# rows/s with chunks of 65,536 against 72-75 % with 16,384 and 73 % with 262,144 (same runs)
_CHUNK = 65_536


def source_options(options: OrderOptions, sizes: Sequence[int]) -> tuple[OrderOptions, ...]:
    """Each source's pass-order options: ``options`` with the partitions cut in proportion to
    the source's size, ``P_i = max(1, round(P * N_i / sum N))``.

    Every source's partitions are then about as long as those of one dataset holding all the
    mixture's rows under ``options``. With ``P`` for every source (before
    :data:`MIXTURE_ORDER`) the small sources' partitions were shorter than a block, where an
    id costs up to twice as much (a short block's Feistel walk), and staging a round of every
    source held the sources' count times one dataset's rows (bench/RESULTS.md "Mixtures").
    A mixture's ranks take positions of its stream, never partitions, so ``P_i`` need not be
    divisible by the world size.
    """
    if not options.shuffle:
        return tuple(options for _ in sizes)
    total, P = sum(int(n) for n in sizes), int(options.partitions)
    return tuple(dataclasses.replace(options, partitions=max(1, (2 * P * int(n) + total)
                                                             // (2 * total))) for n in sizes)


class PassOrders:
    """The per-pass orders of a mixture's sources, built on demand and kept (a few), and the
    one background thread (``stoker-order``, started at the first :meth:`ahead`) that computes
    the ids of a mixture's next chunk while the current one is read."""

    def __init__(self, shard_rows: list[np.ndarray], fingerprints: list[str], seed: int,
                 options: OrderOptions, keep: int = 64) -> None:
        self._rows, self._fps, self.seed, self.options = shard_rows, fingerprints, seed, options
        self._each = source_options(options, [int(np.sum(r)) for r in shard_rows])
        self._keep = keep
        self._cache: OrderedDict[tuple[int, int], EpochOrder] = OrderedDict()
        self._lock = threading.Lock()
        self._thread = ChunkThread()
        # (epoch, rank, world size, hi, future): the next loader epoch's first chunk, asked
        # when the current epoch's chunks reached its end (MixtureOrder._next_epoch)
        self._upcoming: tuple[int, int, int, int, Future[np.ndarray]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()
                if k not in ("_cache", "_lock", "_upcoming")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._cache, self._lock = OrderedDict(), threading.Lock()
        self._upcoming = None

    def ask_upcoming(self, epoch: int, rank: int, world_size: int, hi: int,
                     compute: Any) -> None:
        """Compute ``compute(rank, hi, world_size)``, loader epoch ``epoch``'s first chunk,
        on the background thread, for that epoch's order to take (:meth:`upcoming`)."""
        future = self.ahead(compute, rank, hi, world_size)
        if future is not None:
            with self._lock:
                self._upcoming = (epoch, rank, world_size, hi, future)

    def upcoming(self, epoch: int) -> tuple[int, int, int, Future[np.ndarray]] | None:
        """``(rank, world size, hi, future)`` of loader epoch ``epoch``'s first chunk if it
        was asked ahead (once: it is handed over), else ``None``; a chunk asked for another
        epoch is dropped."""
        with self._lock:
            up, self._upcoming = self._upcoming, None
        return up[1:] if up is not None and up[0] == epoch else None

    def ahead(self, fn: Any, *args: Any) -> Future[Any] | None:
        """``fn(*args)`` on the background thread (:meth:`ChunkThread.ahead`)."""
        return self._thread.ahead(fn, *args)

    def close(self) -> None:
        """Stop the background thread (:meth:`ChunkThread.close`). Idempotent."""
        self._thread.close()

    def get(self, source: int, pass_: int) -> EpochOrder:
        key = (source, pass_)
        with self._lock:
            order = self._cache.get(key)
            if order is not None:
                self._cache.move_to_end(key)
                return order
        order = EpochOrder(self._rows[source], self._fps[source], self.seed, pass_,
                           self._each[source])
        with self._lock:
            self._cache[key] = order
            while len(self._cache) > self._keep:
                self._cache.popitem(last=False)
        return order

    def ids(self, src: np.ndarray, pick: np.ndarray, sizes: np.ndarray,
            offsets: np.ndarray) -> np.ndarray:
        """Mixture ids of the picks ``(src, pick)`` (int64, same length, any order).

        Source ``i``'s picks lie in ``[lo_i, hi_i)``: that span is read as one contiguous
        range of each of its passes (the range kernel) into a buffer, and every position
        takes its id from there (stoker.loader.order.mixture_kernel), with no sort by source.
        """
        if not len(src):
            return np.empty(0, dtype=np.int64)
        src, pick = np.ascontiguousarray(src), np.ascontiguousarray(pick)  # one kernel layout
        lo, hi = pick_spans(src, pick, np.int64(len(sizes)))
        span = hi - lo
        base = np.cumsum(span) - span
        buf = np.empty(int(span.sum()), dtype=np.int64)
        for i in np.flatnonzero(span).tolist():
            n, a, b, at = int(sizes[i]), int(lo[i]), int(hi[i]), int(base[i])
            for p in range(a // n, (b - 1) // n + 1):  # the passes the span crosses
                s, e = max(a, p * n), min(b, (p + 1) * n)
                buf[at + s - a:at + e - a] = self.get(i, p).ids(s - p * n, e - p * n)
        return place(src, pick, lo, base, buf, offsets)


class MixtureOrder:
    """``O[k]`` for ``k`` in ``[0, L)`` of one loader epoch of a mixture (random access).

    Args:
        mixture: the :class:`~stoker.loader.order.mixture.Mixture` (its blend and sizes).
        passes: the sources' pass orders (seed and order options inside).
        epoch: the loader epoch.
        chunk: positions whose ids :meth:`rank_ids` computes in one go.
    """

    def __init__(self, mixture: Any, passes: PassOrders, epoch: int,
                 chunk: int = _CHUNK) -> None:
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise OrderError(f"epoch must be an int >= 0, got {epoch!r}")
        self.mixture, self.passes, self.epoch = mixture, passes, int(epoch)
        self.num_samples = mixture.num_samples
        self.options = passes.options
        self.seed = passes.seed
        self.fingerprint = mixture.fingerprint
        self._sizes = np.asarray(mixture.sizes, dtype=np.int64)
        self._base = self.epoch * self.num_samples
        self._chunk = chunk
        self._windows = Windows(self._chunk_ids, self.num_samples, chunk, passes.ahead,
                                self._next_epoch)
        up = passes.upcoming(self.epoch)
        if up is not None:
            self._windows.prime(*up)

    def __repr__(self) -> str:
        return f"MixtureOrder(epoch={self.epoch}, num_samples={self.num_samples}, {self.mixture})"

    def sources(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """(source, pick) of positions ``[start, stop)`` of this epoch."""
        start, stop = check_window(start, stop, self.num_samples)
        return self.mixture.blend.picks(self._base + start, self._base + stop)

    def _ids(self, src: np.ndarray, pick: np.ndarray) -> np.ndarray:
        return self.passes.ids(src, pick, self._sizes, self.mixture.offsets)

    def ids(self, start: int, stop: int) -> np.ndarray:
        """Mixture ids ``O[start:stop]`` (int64)."""
        return self._ids(*self.sources(start, stop))

    def rank_ids(self, start: int, stop: int, rank: int, world_size: int) -> np.ndarray:
        """``[O[k] for k in range(start, stop) if k % world_size == rank]``.

        The loader asks for consecutive windows: they are cut from chunks of ``chunk``
        positions (stoker.loader.order.windows), one blend call and one range per source
        and pass for many batches. The chunks after the kept one are computed ahead on
        :class:`PassOrders`' background thread: computed here, a chunk (~1.3 ms for 16 k W1
        positions) stalled thread workers whose queue held less work than that
        (bench/mixture_bench.py). The ids are the same either way.
        """
        return self._windows.rank_ids(start, stop, rank, world_size)

    def windows(self, ahead: Ahead | None = None) -> Windows:
        """What the loader reads consecutive batch windows from (:meth:`rank_ids`); its
        chunks ahead come from its passes' thread (:class:`PassOrders`), not ``ahead``."""
        return self._windows

    @property
    def chunks_ahead(self) -> int:
        """Chunks :meth:`rank_ids` took from the background thread."""
        return self._windows.chunks_ahead

    def _next_epoch(self, size: int, rank: int, world_size: int) -> None:
        """This epoch's last chunk is asked: ask the next epoch's first one too, so its first
        batch does not wait for it (the loader reads epoch ``e + 1`` after ``e`` unless told
        otherwise; W1, 600 k rows, 2 thread workers: ~3 ms of a ~50 ms epoch)."""
        nxt = MixtureOrder(self.mixture, self.passes, self.epoch + 1, self._chunk)
        hi = min(self.num_samples, rank + size)
        self.passes.ask_upcoming(self.epoch + 1, rank, world_size, hi, nxt._chunk_ids)

    def _chunk_ids(self, first: int, hi: int, world_size: int) -> np.ndarray:
        src, pick = self.sources(first, hi)
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
    order = EpochOrder(source.shard_rows, source.fingerprint, seed, epoch, options)
    order.numpy_only = bool(getattr(source, "numba_free", False))
    return order
