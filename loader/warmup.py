"""Load the fast path's compiled kernels in a background thread while the loader is set up.

A fresh process pays ~0.3-0.5 s before its first batch for Numba's one-time start-up and for
loading each cached kernel (shared/FIELD-NOTES.md). That work does not depend on the data:
only on the kernels' argument *types*. :func:`start` runs the fast plan once, in a daemon
thread, over a two-row table of the dataset's schema (read-only buffers, like a
memory-mapped shard), so the kernels a batch will call are loaded while the user builds a
model or an optimiser. Start-up work that happens anyway is merely moved earlier; a failure
only means the first batch loads the kernels itself (logged at debug level).

Fork safety: a child forked while the thread holds Numba's compiler lock would deadlock on
its first kernel call, so an at-fork hook waits for the warm-up before any ``fork``.
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pyarrow as pa

from stoker.loader.fallbacks import note

if TYPE_CHECKING:
    from stoker.loader.fastpath import FastPlan

__all__ = ["first_call", "prime", "start", "wait"]


_lock = threading.Lock()
_threads: list[threading.Thread] = []
_done: set[tuple[str, ...]] = set()  # plans already warmed in this process
_first: set[str] = set()  # see first_call


def wait() -> None:
    """Block until every warm-up started in this process has finished."""
    with _lock:
        threads = list(_threads)
    for t in threads:
        if t is not threading.current_thread():
            t.join()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=wait)
atexit.register(wait)  # a thread stopped inside Numba at interpreter exit can crash it


def _zero(t: pa.DataType) -> pa.Array:
    """A one-value array of type ``t`` with real buffers (all-null arrays may have none)."""
    if pa.types.is_dictionary(t):
        return pa.DictionaryArray.from_arrays(pa.array([0], t.index_type),
                                              pa.nulls(1, t.value_type))
    if pa.types.is_large_list(t):
        return pa.LargeListArray.from_arrays(pa.array([0, 1], pa.int64()), _zero(t.value_type))
    if pa.types.is_list(t):
        return pa.ListArray.from_arrays(pa.array([0, 1], pa.int32()), _zero(t.value_type))
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return pa.array([b"0"], t)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pa.array(["0"], t)
    if pa.types.is_boolean(t):
        return pa.array([False], t)
    return pa.array([0], t)


def _tiny_shard(schema: pa.Schema, columns: list[str]) -> tuple[list[pa.RecordBatch], pa.Buffer]:
    """Two rows of ``columns`` and the read-only IPC file holding them (their arena)."""
    fields = [schema.field(c) for c in columns]
    # two rows: a one-row shard's record views would be C-contiguous, a real shard's are not
    batch = pa.RecordBatch.from_arrays([pa.concat_arrays([_zero(f.type)] * 2) for f in fields],
                                       schema=pa.schema(fields))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batch.schema) as w:
        w.write_batch(batch)
    arena = pa.py_buffer(sink.getvalue().to_pybytes())
    return [pa.ipc.open_file(arena).get_batch(0)], arena


def _run(plan: FastPlan, schema: pa.Schema, row_major: bool) -> None:
    """Load the kernels in the order a first batch needs them: the order's, the records
    gather (records already on disk are mapped when a shard opens), the column kernels, then
    the kernels that build records."""
    from stoker.loader import rowmajor
    from stoker.loader.fastpath import ShardData
    from stoker.loader.record_table import RecordTable
    from stoker.loader.ring import BufferRing

    _order()
    try:
        batches, arena = _tiny_shard(schema, plan.kernel_columns)
        data = ShardData(batches, arena, plan.kernel_columns)
        ring = BufferRing(1, False)
        one = np.zeros(1, dtype=np.int64)
        slot = ring.acquire()
        try:
            layout = rowmajor.RecordLayout.of(plan, batches) if row_major else None
            if layout is not None:
                table = RecordTable(layout, 1)
                table.add(0, np.zeros((2, layout.stride), dtype=np.uint8))
                table.gather(one, np.array([0, 2], dtype=np.int64), slot, kernel=True)
            plan.run([(data, one, one, one)], 1, slot, lambda cols: {c: None for c in cols})
            if layout is not None:
                rowmajor.build(layout, data, layout.misfits(batches))
        finally:
            ring.release(slot)
    except _expected() as exc:  # only a head start; the first batch loads them (or raises)
        note("warmup_skipped", f"kernels: {type(exc).__name__}: {exc}")


def start(plan: FastPlan, schema: pa.Schema, row_major: bool) -> None:
    """Warm ``plan``'s kernels in a daemon thread (once per plan shape and process)."""
    if plan.image is not None:  # decoding needs real images; not worth a fake one
        return
    key = (*plan.kernel_columns, *(o.name for o in plan.outputs), str(row_major))
    _spawn(key, _run, (plan, schema, row_major))


def _order() -> None:
    from stoker.loader.feistel import order_range
    from stoker.loader.order import EpochOrder, OrderOptions

    try:
        order = EpochOrder(np.array([64, 64], dtype=np.int64), "0" * 32, 0, 0, OrderOptions())
        order_range(np.int64(0), np.int64(4), np.int64(1), *order._kernel_args())
    except _expected() as exc:  # only a head start
        note("warmup_skipped", f"order: {type(exc).__name__}: {exc}")


def _expected() -> tuple[type[BaseException], ...]:
    """What compiling or loading kernels on a synthetic shard may raise (a fallback); anything
    else is a bug and propagates (the warm-up thread then prints it)."""
    from numba.core.errors import NumbaError

    return (NumbaError, ImportError, OSError, MemoryError, RuntimeError, ValueError, TypeError,
            pa.ArrowException)


def first_call(name: str) -> bool:
    """True for the first call of ``name`` in this process if a warm-up thread is still
    loading kernels: that call (the first batch's order or gather) may use its NumPy twin
    instead of waiting for Numba's start-up. Later calls wait for the kernels: NumPy batches
    competing with the warm-up for the GIL measured slower overall (bench/RESULTS.md)."""
    if name in _first:  # every call but a process's first: no lock
        return False
    with _lock:
        if name in _first:
            return False
        _first.add(name)
        return any(t.is_alive() for t in _threads)


def prime() -> None:
    """Start Numba's one-time runtime initialisation (~0.2 s of imports and type registries,
    the bulk of a fresh process's first batch) and load the order's kernels, in a daemon
    thread, once per process. Called when :mod:`stoker.loader.dataloader` is imported, so a
    script that imports stoker and then builds its model finds it done."""
    _spawn(("order",), _order, ())


def _spawn(key: tuple[str, ...], target: Callable[..., None], args: tuple[Any, ...]) -> None:
    with _lock:
        if key in _done:
            return
        _done.add(key)
        thread = threading.Thread(target=target, args=args, name="stoker-warmup", daemon=True)
        _threads[:] = [t for t in _threads if t.is_alive()] + [thread]
    thread.start()
