"""Warm the fast path's kernels before the first batch: the order's, the gathers of a plan,
the record builders and the image augmentations, each run once on a synthetic two-row shard.

:func:`start` runs a fast plan once, in a warm-up thread (:mod:`stoker.loader.jit.warmup`),
over a two-row table of the dataset's schema (read-only buffers, like a memory-mapped shard),
so the kernels a batch will call are loaded while the user builds a model or an optimiser.
Start-up work that happens anyway is merely moved earlier; a failure only means the first
batch loads the kernels itself (a ``"warmup_skipped"`` fallback).

On a node whose Numba cache is empty, compiling the kernels takes 25-60 s of one core
(bench/coldstart_bench.py ``--profile``). Batches do not wait for it: until the warm-up of
their plan has finished (:func:`ready`), :class:`~stoker.loader.read.arrow.ArrowSource`
reads them through its pyarrow path, which gives byte for byte the batches the kernels give
(tests/fastpath/test_cold_start.py), and counts each as a ``"compiling"`` fallback; the
first batch after the warm-up uses the kernels (``loader.stats["kernel_switches"]``).
``STOKER_COLD_START=wait`` restores the old behaviour (the first batch compiles the kernels
itself): the test suite uses it, so which path served a batch never depends on timing there.
Compiling holds the GIL, so on such a node a warm-up first waits (at most :data:`_HOLD_S`)
for the first batch to be served (:func:`served`).

This lives in the fast path, not in jit, because it runs plans and the order: jit is the
bottom layer (``jit <- order <- fastpath``) and only runs the threads.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from stoker.loader.fallbacks import note
from stoker.loader.fastpath import kernels, rowmajor
from stoker.loader.fastpath.images import ImageOptions, _unit, crop_box, resample
from stoker.loader.fastpath.plan import FastPlan, ShardData
from stoker.loader.fastpath.record_table import RecordTable
from stoker.loader.fastpath.ring import BufferRing
from stoker.loader.jit import aot, fork_gate, warmup
from stoker.loader.jit.kernel import compiled, made
from stoker.loader.order.blend import Blend
from stoker.loader.order.epoch import EpochOrder
from stoker.loader.order.feistel import order_range
from stoker.loader.order.mixture_kernel import pick_spans, place, source_of
from stoker.loader.order.options import OrderOptions

__all__ = ["after_first_batch", "plan_key", "prime", "prime_columns_to_records",
           "prime_mixture", "ready", "served", "start", "usable"]

_served = threading.Event()  # a first batch was delivered in this process (see served)
_HOLD_S = 1.0  # longest a warm-up waits for that first batch before it compiles anyway
_warm: list[bool] = []  # _compiled_before(), asked once per process


def prime() -> None:
    """Start Numba's one-time runtime initialisation (~0.2 s of imports and type registries,
    the bulk of a fresh process's first batch) and load the order's kernels, in a warm-up
    thread, once per process. Called when a DataLoader is built (never at import), so a script
    that builds its model meanwhile finds it done. Nothing when the node compiled the order's
    kernel ahead of time (stoker.loader.jit.aot): the order then needs no Numba."""
    if aot.function("order_range") is not None:
        return
    warmup.spawn(("order",), _held, _order)


def prime_mixture() -> None:
    """Load a mixture's own kernels (the blend's, stoker.loader.order.mixture_kernel) in a
    warm-up thread, once per process: called when a mixture is opened, so its first batch
    does not compile or load them (~1 s on a node whose Numba cache is empty)."""
    warmup.spawn(("mixture",), _held, _mixture)


def prime_columns_to_records() -> None:
    """Load the kernel that makes indexed Parquet's plain row groups row-major
    (:func:`~stoker.loader.fastpath.kernels.columns_to_records`) in a warm-up thread, once per
    process: called by readers of indexed Parquet only (loading it from the cache takes
    ~0.2 s of the warm-up thread, which every other loader would spend for nothing). Nothing
    when the node compiled it ahead of time (stoker.loader.jit.aot): it then needs no Numba."""
    if aot.function("columns_to_records") is not None:
        return
    warmup.spawn(("columns_to_records",), _held, _columns_to_records)


def plan_key(plan: FastPlan, row_major: bool) -> tuple[str, ...]:
    """What a plan's warm-up depends on (one warm-up per key and process)."""
    return (*plan.kernel_columns, *(f"{o.name}:{o.kind}" for o in plan.outputs), str(row_major),
            repr(plan.image))


def start(plan: FastPlan, schema: pa.Schema, row_major: bool) -> tuple[str, ...]:
    """Warm ``plan``'s kernels in a warm-up thread (once per plan shape and process); returns
    the plan's key (see :func:`ready`)."""
    key = plan_key(plan, row_major)
    warmup.spawn(key, _held, _run_plan, plan, schema, row_major)
    return key


def ready(key: tuple[str, ...], plan: FastPlan, schema: pa.Schema, row_major: bool) -> bool:
    """Whether a batch of plan ``key`` may use the kernels now: the plan's warm-up has
    finished in this process (started here if it was not), or the node compiled the kernels
    before (batches then load them from the cache, as the warm-up does), or
    ``STOKER_COLD_START=wait`` (batches compile what they need themselves)."""
    if warmup.finished(key):
        return True
    if _loadable():
        return True  # loading cached kernels (~0.3 s) beats the twins racing it for the GIL
    if not warmup.started(key):  # a forked or unpickled worker: its own warm-up
        start(plan, schema, row_major)
    return warmup.finished(key)


def usable(fn: Any) -> bool:
    """Whether kernel ``fn`` may be called now without compiling it on the caller's thread:
    it is compiled in this process, or the node compiled the kernels before (a call loads it
    from the cache), or ``STOKER_COLD_START=wait``. Otherwise its caller uses its NumPy form
    (same bytes) while a warm-up compiles it."""
    return compiled(fn) or _loadable()


def _loadable() -> bool:
    """Whether a batch's thread may call a kernel that is not compiled in this process: the
    node compiled the kernels before (a call loads them), or ``STOKER_COLD_START=wait``."""
    return warmup.kernels_wait() or _warm_node(ask=False)


def served() -> None:
    """A batch was read: warm-ups waiting for the first batch start compiling now. Numba's
    compiler is Python code holding the GIL; the first batch, read meanwhile through the
    NumPy twins, measured 0.3-0.5 s slower against it (bench/coldstart_bench.py)."""
    if not _served.is_set():
        _served.set()


def after_first_batch(fn: Callable[..., None], *args: Any) -> None:
    """``fn(*args)`` once a first batch was delivered (or :data:`_HOLD_S` passed) on a node
    whose kernels must compile: for background work that compiles kernels (building
    row-major records)."""
    _hold()
    fn(*args)


def _held(target: Callable[..., None], *args: Any) -> None:
    """A warm-up: ``target(*args)`` after :func:`_hold`."""
    _hold()
    target(*args)


def _hold() -> None:
    """Wait for a first batch (at most :data:`_HOLD_S`) when the kernels must compile."""
    if not _served.is_set() and not _warm_node():
        _served.wait(_HOLD_S)


def _warm_node(ask: bool = True) -> bool:
    """Whether this node compiled stoker's kernels before: it has their module compiled
    ahead of time (stoker.loader.jit.aot), or :func:`_compiled_before`. Asking the latter
    makes the kernels (imports Numba, ~0.3 s), so a batch's thread asks with ``ask=False``:
    not known yet counts as no (the batch uses the NumPy twins) while a warm-up thread finds
    out."""
    if not _warm:
        if aot.function("record_gather") is not None:
            _warm.append(True)  # built only by a process whose kernels loaded from the cache
        elif not ask and not made():
            return False
        else:
            _warm.append(_compiled_before())
    return _warm[0]


def _compiled_before() -> bool:
    """Whether Numba's cache holds stoker's kernels already (this node compiled them before):
    loading them takes ~0.3 s, best done at once (while the caller builds a model); only
    compiling them is worth holding back for the first batch. Unknown counts as yes."""
    try:
        return os.path.exists(kernels.gather_fixed._cache._cache_file._index_path)
    except AttributeError:  # another Numba's cache internals: do not hold anything back
        return True


def _expected() -> tuple[type[BaseException], ...]:
    """What warming a plan on a synthetic shard may raise: a lost head start, not a bug."""
    return (*warmup.compile_errors(), pa.ArrowException)


def _columns_to_records() -> None:
    none, one = np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64)
    try:
        kernels.columns_to_records(none, none, none, 0, 1, one.ctypes.data, 8)
    except _expected() as exc:  # only a head start
        note("warmup_skipped", f"columns_to_records: {type(exc).__name__}: {exc}")


def _order() -> None:
    if aot.function("order_range") is not None:
        return  # the order calls the kernel compiled ahead of time
    try:
        order = EpochOrder(np.array([64, 64], dtype=np.int64), "0" * 32, 0, 0, OrderOptions())
        order_range(np.int64(0), np.int64(4), np.int64(1), *order._kernel_args())
    except _expected() as exc:  # only a head start
        note("warmup_skipped", f"order: {type(exc).__name__}: {exc}")


def _mixture() -> None:
    try:
        Blend([(0, [1, 2]), (2, [2, 1])]).picks(0, 4)  # a schedule: run_blend
        src, pick = Blend([(0, [1, 2])]).picks(0, 4)  # none: run_blend_flat
        lo, _ = pick_spans(src, pick, np.int64(2))
        zeros = np.zeros(4, dtype=np.int64)
        place(src, pick, lo, zeros[:2].copy(), zeros, zeros[:3].copy())
        source_of(zeros, zeros[:3].copy())
    except _expected() as exc:  # only a head start
        note("warmup_skipped", f"mixture: {type(exc).__name__}: {exc}")


def _run_plan(plan: FastPlan, schema: pa.Schema, row_major: bool) -> None:
    """The warm-up of a plan; for an image plan, the image options' own kernels first, then
    every other kernel the plan calls (the image column's bytes are gathered as a binary
    column would be)."""
    if plan.image is None:
        _run(plan, schema, row_major)
        return
    try:
        _images(plan.image)
    except _expected() as exc:  # only a head start
        note("warmup_skipped", f"images: {type(exc).__name__}: {exc}")
    grouped = {o.name: list(o.columns) for o in plan.outputs if o.kind == "matrix"}
    _run(FastPlan(schema, [c for o in plan.outputs for c in o.columns],
                  grouped.get("features", []), grouped.get("categoricals", [])),
         schema, row_major)


def _run(plan: FastPlan, schema: pa.Schema, row_major: bool) -> None:
    """Load the kernels in the order a first batch needs them: the order's, the records
    gather (records already on disk are mapped when a shard opens), the column kernels, then
    the kernels that build records. On a node that compiled them before (they load from
    Numba's cache), then build the kernels compiled ahead of time if the node has none yet
    (stoker.loader.jit.aot: later processes then need no Numba for stored records)."""
    if _warm_node():
        aot.build_in_background()
    _order()
    _on_tiny_shard(plan, schema, row_major, every=True)


def _on_tiny_shard(plan: FastPlan, schema: pa.Schema, row_major: bool, every: bool) -> None:
    """Call ``plan``'s kernels once on a two-row shard of ``schema``: the records gather's JIT
    kernel (``row_major``), then, when ``every``, the column kernels and the record builders."""
    try:
        with fork_gate.unit():  # pyarrow's locks must not be held at a worker's fork
            batches, arena = _tiny_shard(schema, plan.kernel_columns)
        layout = rowmajor.RecordLayout.of(plan, batches) if row_major else None
        ring = BufferRing(1, False)
        one = np.zeros(1, dtype=np.int64)
        slot = ring.acquire()
        try:
            if layout is not None:
                table = RecordTable(layout, 1)
                table.add(0, np.zeros((2, layout.stride), dtype=np.uint8))
                table.gather(one, np.array([0, 2], dtype=np.int64), slot, kernel=True,
                             jit=True)
            if every:
                data = ShardData(batches, arena, plan.kernel_columns)
                plan.run([(data, one, one, one)], 1, slot, lambda cols: {c: None for c in cols})
                if layout is not None:
                    rowmajor.build(layout, data, layout.misfits(batches))
        finally:
            ring.release(slot)
    except _expected() as exc:  # only a head start; the first batch loads them (or raises)
        note("warmup_skipped", f"kernels: {type(exc).__name__}: {exc}")


def _images(options: ImageOptions) -> None:
    """Compile the augmentation kernels with the argument types ``decode_into`` passes."""
    if options.identity:
        return
    key, sample = np.uint64(1), np.int64(0)
    box = crop_box(key, sample, 2, 2, 0.5, 1.0, 0.75, 1.25) if options.crop is not None \
        else (0, 0, 2, 2)
    _unit(key, sample, 99)
    out = np.zeros((1, *options.size, 3), dtype=options.dtype)
    resample(np.zeros((2, 2, 3), np.uint8), *box, False, 1.0, np.zeros(3), np.ones(3),
             options.output != "float32", out[0])


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
