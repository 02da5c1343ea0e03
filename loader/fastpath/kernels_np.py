"""NumPy twins of the gather kernels (:mod:`stoker.loader.fastpath.kernels`): the same arguments, the
same bytes written, no compilation.

A fresh node has no compiled kernels; compiling them takes 25-60 s of one core
(bench/coldstart_bench.py ``--profile``). Until they are ready, :class:`FastPlan.run
<stoker.loader.fastpath.plan.FastPlan>` runs with these instead (:mod:`stoker.loader.fastpath.warm`), so
the first batch costs vectorised NumPy (a few ms per W1 batch), not a compile. Each twin reads
the same arena views and column metadata as its kernel and writes the same values: casts are
NumPy's assignment casts, which are the C casts the kernels' LLVM code performs, nulls are 0,
list padding is 0 (tests/fastpath/test_cold_start.py compares them byte for byte).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from stoker.loader.fastpath import kernels as k
from stoker.loader.jit import aot

if TYPE_CHECKING:
    from stoker.loader.fastpath.plan import FastPlan

__all__ = ["ahead", "gather_binary", "gather_fixed", "gather_list", "var_lengths"]

# physical type code -> (index into arena_views' tuple, log2 of the value's byte width)
# bytes per value past which gather_binary copies a slice per value instead of indexing every
# byte: a W2 batch (256 JPEGs of ~1.5 KB) took ~3 ms byte by byte (py-spy: 40 % of an epoch
# served by the twins), ~0.15 ms by slices
_SLICED = 64
_VIEW = {k.I8: (1, 0), k.I16: (2, 1), k.I32: (3, 2), k.I64: (4, 3), k.U8: (0, 0),
         k.U16: (5, 1), k.U32: (6, 2), k.U64: (7, 3), k.F32: (8, 2), k.F64: (9, 3)}


def _bit(u8: np.ndarray, byte_offset: np.ndarray, k_: np.ndarray) -> np.ndarray:
    """Bit ``k_`` of the bitmap at ``byte_offset`` (0 or 1, uint8)."""
    return (u8[byte_offset + (k_ >> 3)] >> (k_ & 7).astype(np.uint8)) & 1


def _valid(u8: np.ndarray, voff: np.ndarray, k_: np.ndarray) -> np.ndarray:
    """``kernels._valid`` for arrays: no bitmap (``voff < 0``) or the bit is set."""
    has = voff >= 0
    if not has.any():
        return np.ones(k_.shape, dtype=bool)
    return ~has | (_bit(u8, np.where(has, voff, 0), np.where(has, k_, 0)) == 1)


def _values(views: tuple[np.ndarray, ...], code: int, data: np.ndarray,
            e: np.ndarray) -> np.ndarray:
    """Element ``e`` of the fixed-width buffers at byte offsets ``data``, of type ``code``."""
    if code == k.BOOL:
        return _bit(views[0], data, e)
    view, shift = _VIEW[code]
    return views[view][(data >> shift) + e]


def gather_fixed(views: tuple[np.ndarray, ...], meta: np.ndarray, chunk: np.ndarray,
                 row: np.ndarray, dest: np.ndarray, out: np.ndarray) -> None:
    """:func:`kernels.gather_fixed`: columns of one type code are gathered together."""
    if chunk.shape[0] == 0:
        return
    m = meta[chunk]  # [n, K, 4]
    codes = meta[0, :, 0]
    for code in sorted(set(codes.tolist())):  # not np.unique: it imports numpy.ma
        cols = np.flatnonzero(codes == code)
        mc = m[:, cols]
        e = mc[..., 3] + row[:, None]
        vals = _values(views, code, mc[..., 2], e)
        valid = _valid(views[0], mc[..., 1], e)
        with np.errstate(over="ignore", invalid="ignore"):  # the kernels' casts do not warn
            out[dest[:, None], cols[None, :]] = vals
        if not valid.all():
            bad_rows, bad_cols = np.nonzero(~valid)
            out[dest[bad_rows], cols[bad_cols]] = 0


def _bounds(views: tuple[np.ndarray, ...], m: np.ndarray,
            k_: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`kernels._bounds` for rows ``m`` (one schema: offsets all 32- or all 64-bit)."""
    if m.shape[0] and m[0, 2]:
        base = (m[:, 1] >> 3) + k_
        return views[4][base], views[4][base + 1]
    base = (m[:, 1] >> 2) + k_
    return views[3][base].astype(np.int64), views[3][base + 1].astype(np.int64)


def var_lengths(views: tuple[np.ndarray, ...], meta: np.ndarray, chunk: np.ndarray,
                row: np.ndarray, dest: np.ndarray, lengths: np.ndarray) -> None:
    """:func:`kernels.var_lengths`: lengths of list or binary values, null -> -1."""
    if chunk.shape[0] == 0:
        return
    m = meta[chunk]
    e = m[:, 3] + row
    a, b = _bounds(views, m, e)
    lengths[dest] = np.where(_valid(views[0], m[:, 0], e), b - a, -1)


def _spans(m: np.ndarray, views: tuple[np.ndarray, ...],
           row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, count) of each row's value (count 0 for a null)."""
    e = m[:, 3] + row
    a, b = _bounds(views, m, e)
    count = np.where(_valid(views[0], m[:, 0], e), b - a, 0)
    return a, count


def _ramp(count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows with ``count`` items each: (row of each item, item's index in its row)."""
    owner = np.repeat(np.arange(len(count)), count)
    firsts = np.cumsum(count) - count
    return owner, np.arange(int(count.sum()), dtype=np.int64) - firsts[owner]


def gather_list(views: tuple[np.ndarray, ...], meta: np.ndarray, chunk: np.ndarray,
                row: np.ndarray, dest: np.ndarray, out: np.ndarray) -> None:
    """:func:`kernels.gather_list`: list values -> padded rows (padding, nulls -> 0)."""
    if chunk.shape[0] == 0:
        return
    m = meta[chunk]
    a, count = _spans(m, views, row)
    owner, t = _ramp(count)
    mo = m[owner]
    e = mo[:, 7] + a[owner] + t
    vals = _values(views, int(meta[0, 4]), mo[:, 6], e)
    out[dest] = 0
    with np.errstate(over="ignore", invalid="ignore"):
        out[dest[owner], t] = vals
    valid = _valid(views[0], mo[:, 5], e)
    if not valid.all():
        out[dest[owner[~valid]], t[~valid]] = 0


def gather_binary(views: tuple[np.ndarray, ...], meta: np.ndarray, chunk: np.ndarray,
                  row: np.ndarray, dest: np.ndarray, offsets: np.ndarray,
                  out: np.ndarray) -> None:
    """:func:`kernels.gather_binary`: bytes of valid values to ``out[offsets[dest[i]]:]``."""
    if chunk.shape[0] == 0:
        return
    m = meta[chunk]
    a, count = _spans(m, views, row)
    if int(count.sum()) > _SLICED * len(count):  # long values (images): a slice copy each
        data = views[0]
        for s, d, n in zip((m[:, 4] + a).tolist(), offsets[dest].tolist(), count.tolist()):
            out[d:d + n] = data[s:s + n]
        return
    owner, t = _ramp(count)
    out[offsets[dest[owner]] + t] = views[0][m[owner, 4] + a[owner] + t]


def _by_dtype(name: str, numpy: Callable[..., None]) -> Callable[..., None]:
    """A gather writing a 2-D ``out``: the node's twin ``<name>_<out's dtype>`` compiled ahead
    of time, else its NumPy twin ``numpy``."""
    def gather(views: tuple[np.ndarray, ...], meta: np.ndarray, chunk: np.ndarray,
               row: np.ndarray, dest: np.ndarray, out: np.ndarray) -> None:
        fn: Any = out.ndim == 2 and aot.twin(f"{name}_{out.dtype.name}", meta, chunk, row, dest)
        (fn or numpy)(views, meta, chunk, row, dest, out)
    return gather


class _Ahead:
    """The plan kernels' interface (what :meth:`FastPlan.run
    <stoker.loader.fastpath.plan.FastPlan.run>` calls) served by their twins compiled ahead of
    time (stoker.loader.jit.aot), for a process that never imports Numba: its start-up holds
    the GIL ~1 s, as long as a 2 M-row W1 epoch over stored records. A call the node's module
    has no twin for (another dtype, index arrays not C-contiguous int64, binary values) goes
    to the NumPy twin above: the same bytes either way (tests/fastpath/test_aot.py)."""

    @staticmethod
    def covers(plan: FastPlan) -> bool:
        """Whether every output of ``plan`` is gathered by a twin compiled ahead of time."""
        return all(o.kind in ("matrix", "fixed", "list") and o.dtype is not None and
                   aot.function(f"{'gather_list' if o.kind == 'list' else 'gather_fixed'}_"
                                f"{np.dtype(o.dtype).name}") is not None and
                   (o.kind != "list" or aot.function("var_lengths") is not None)
                   for o in plan.outputs)

    @staticmethod
    def var_lengths(views: tuple[np.ndarray, ...], meta: np.ndarray, chunk: np.ndarray,
                    row: np.ndarray, dest: np.ndarray, lengths: np.ndarray) -> None:
        fn = aot.twin("var_lengths", meta, chunk, row, dest, lengths)
        (fn or var_lengths)(views, meta, chunk, row, dest, lengths)

    gather_fixed = staticmethod(_by_dtype("gather_fixed", gather_fixed))
    gather_list = staticmethod(_by_dtype("gather_list", gather_list))
    gather_binary = staticmethod(gather_binary)


#: the plan kernels' twins compiled ahead of time (see :class:`_Ahead`)
ahead = _Ahead()
