"""Consecutive windows of one rank's ids, computed a chunk of positions at a time.

The loader asks its order for one batch window after the other. An order kernel sets up
per call what the window's positions share (a partition's block state, a mixture's blend
window and one range per source pass), so a window of one batch pays that setup for few
ids: ``EpochOrder`` at 600 k W1 rows costs ~55 ns/id in 1,024-id calls against ~15 ns/id
in 16 k-position chunks (bench/order_bench.py). :class:`Windows` computes the ids of the
next ``chunk`` positions at once, keeps them, and cuts the windows out of them; with an
``ahead`` executor it asks for the chunks after the kept one in the background. The ids
are the order's either way.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import numpy as np

from stoker.loader.jit import executors, fork_gate
from stoker.loader.order.options import check_rank, check_window

__all__ = ["CHUNK", "ChunkThread", "Windows"]

CHUNK = 16_384  # positions whose ids one chunk holds
# chunks computed ahead: slack for an order thread that shares the cores with busy workers
_AHEAD = 2

Compute = Callable[[int, int, int], np.ndarray]
Ahead = Callable[..., "Future[np.ndarray] | None"]


class ChunkThread:
    """The one background thread (``stoker-order``, started at the first :meth:`ahead`)
    that computes an order's next chunks while the loader reads the kept one: the ``ahead``
    of :class:`Windows`. A shuffled W1 epoch without workers spent ~15 % of its batches'
    time in the order kernel (2 M rows, records on disk, py-spy), on the one core of the two
    that the loop uses; the kernels give the GIL up (later epochs 1.09-1.16x faster with the
    thread, bench/RESULTS.md "Workers (2,000,000 W1 rows)", session 34). A forked child
    starts its own thread (it has none of its parent's); a pickled one arrives without its
    thread, closed or not as it was."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: tuple[int, ThreadPoolExecutor] | None = None  # (pid that started it, pool)
        self._closed = False

    def __getstate__(self) -> dict[str, Any]:
        return {"_closed": self._closed}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
        self._closed = state["_closed"]

    def ahead(self, fn: Any, *args: Any) -> Future[Any] | None:
        """``fn(*args)`` on the background thread, as a unit a fork waits for (it runs
        kernels and may take its order's locks); ``None`` once closed (the caller computes
        it when it needs it)."""
        def unit() -> Any:
            with fork_gate.unit():
                return fn(*args)

        with self._lock:
            if self._closed:
                return None
            if self._pool is None or self._pool[0] != os.getpid():
                self._pool = (os.getpid(),
                              ThreadPoolExecutor(1, thread_name_prefix="stoker-order"))
            return self._pool[1].submit(unit)

    def close(self) -> None:
        """Stop the thread once the chunks asked of it are computed (~1 ms each: an order
        still holding their futures gets its ids, never a cancellation); later chunks are
        computed inline. Idempotent."""
        with self._lock:
            pool, self._pool, self._closed = self._pool, None, True
        if pool is not None:
            executors.stop(pool[1], cancel_futures=False)


class Windows:
    """``rank_ids(start, stop, rank, world_size)`` of an order, from kept chunks.

    Args:
        compute: ``compute(first, hi, world_size)``: the ids of positions
            ``range(first, hi, world_size)`` (what the order's own range call gives).
        num_samples: the order's positions.
        chunk: positions computed in one ``compute`` call.
        ahead: ``ahead(fn, *args)`` runs ``fn(*args)`` in the background and returns its
            future, or ``None`` when it cannot (the chunk is then computed when needed);
            ``None``: no chunks are computed ahead.
        after_end: called once, as ``after_end(size, rank, world_size)``, when the chunks
            asked ahead reach the order's end (what comes next is another order's: the
            caller may compute its first chunk of ``size`` positions ahead, :meth:`prime`).

    One consumer asks for windows (the loader's iterator); not safe for concurrent callers.
    """

    def __init__(self, compute: Compute, num_samples: int, chunk: int = CHUNK,
                 ahead: Ahead | None = None,
                 after_end: Callable[[int, int, int], None] | None = None) -> None:
        self._compute, self.num_samples = compute, int(num_samples)
        self._chunk, self._ahead_fn, self._after_end = max(1, int(chunk)), ahead, after_end
        self._kept: tuple[int, int, int, int, np.ndarray] | None = None  # see rank_ids
        self._ahead: list[tuple[int, int, int, int, Future[np.ndarray]]] = []
        self.chunks_ahead = 0  # chunks taken from the background

    def rank_ids(self, start: int, stop: int, rank: int, world_size: int) -> np.ndarray:
        """``[O[k] for k in range(start, stop) if k % world_size == rank]`` (a new array).

        ``kept`` is ``(first, rank, world_size, hi, ids)``: the ids of positions
        ``range(first, hi, world_size)``. A window it does not hold is taken from the chunk
        computed ahead (joined to the kept chunk's rest when it crosses their border), else
        computed with the chunk after it.
        """
        check_rank(rank, world_size)
        start, stop = check_window(start, stop, self.num_samples)
        first = start + (rank - start) % world_size
        if first >= stop:
            return np.empty(0, dtype=np.int64)
        kept = self._kept
        if kept is None or kept[1:3] != (rank, world_size) or not kept[0] <= first or \
                stop > kept[3]:
            kept = self._kept = self._take_ahead(kept, first, stop, rank, world_size) or \
                self._chunk_at(first, max(stop, first + self._chunk), rank, world_size)
        if self._ahead_fn is not None:
            self._ask_ahead(kept[3], max(self._chunk, stop - first), rank, world_size)
        lo = (first - kept[0]) // world_size
        return kept[4][lo:lo + len(range(first, stop, world_size))].copy()

    def _ask_ahead(self, end: int, size: int, rank: int, world_size: int) -> None:
        """Keep ``_AHEAD`` chunks after ``end`` asked of the background (each holds a whole
        window of ``size`` positions)."""
        while len(self._ahead) < _AHEAD:
            if self._ahead:
                end = self._ahead[-1][3]
            lo = end + (rank - end) % world_size
            if lo >= self.num_samples:
                if self._after_end is not None:
                    self._after_end(size, rank, world_size)
                    self._after_end = None
                return
            hi = min(self.num_samples, lo + size)
            future = self._ahead_fn(self._compute, lo, hi, world_size)  # type: ignore[misc]
            if future is None:
                return
            self._ahead.append((lo, rank, world_size, hi, future))

    def prime(self, rank: int, world_size: int, hi: int, ids: Future[np.ndarray]) -> None:
        """Take the ids of rank ``rank``'s positions ``[0, hi)`` from ``ids``, computed
        elsewhere (another order's ``after_end``), for the first window that starts there;
        before any window was asked."""
        if self._kept is None and not self._ahead:
            self._ahead.append((rank, rank, world_size, hi, ids))

    def _chunk_at(self, first: int, hi: int, rank: int,
                  world_size: int) -> tuple[int, int, int, int, np.ndarray]:
        hi = min(self.num_samples, hi)
        return first, rank, world_size, hi, self._compute(first, hi, world_size)

    def _take_ahead(self, kept: tuple[int, int, int, int, np.ndarray] | None, first: int,
                    stop: int, rank: int,
                    world_size: int) -> tuple[int, int, int, int, np.ndarray] | None:
        """The window ``[first, stop)`` from the chunk computed ahead, joined to the rest of
        the ``kept`` one when the window starts there (a batch across the chunks' border);
        ``None`` when they do not hold it (and the chunks ahead are dropped)."""
        ahead = self._ahead.pop(0) if self._ahead else None
        if ahead is None or ahead[1:3] != (rank, world_size) or stop > ahead[3]:
            self._ahead.clear()
            return None
        if ahead[0] <= first:
            ids = self._result(ahead)
        elif kept is not None and kept[1:3] == (rank, world_size) and kept[0] <= first:
            ids = np.concatenate([kept[4][(first - kept[0]) // world_size:], self._result(ahead)])
        else:
            self._ahead.clear()
            return None
        self.chunks_ahead += 1
        return min(first, ahead[0]), rank, world_size, ahead[3], ids

    def _result(self, ahead: tuple[int, int, int, int, Future[np.ndarray]]) -> np.ndarray:
        """The ids of a chunk asked ahead; computed here instead when it is not done and
        this thread may not wait for it: inside a fork's quiet block or a unit
        (stoker.loader.jit.fork_gate), the background unit computing it may be the one
        waiting for that fork (a loader forking process workers computes their first tasks'
        ids in its quiet block)."""
        lo, _, world_size, hi, future = ahead
        if future.done() or not fork_gate.exempt():
            return future.result()
        return self._compute(lo, hi, world_size)
