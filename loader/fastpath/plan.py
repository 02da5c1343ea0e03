"""The fast path: a plan that turns shard rows into a batch with fused Numba kernels.

A :class:`FastPlan` is built once from the dataset schema and the requested columns; it
declares every output (name, kind, dtype, and its shape as a function of the batch) up front,
so the buffers come from a :class:`~stoker.loader.fastpath.ring.BufferRing` allocated once. Reading a
batch is then one kernel call for every output the shards' row-major records hold
(:mod:`stoker.loader.fastpath.rowmajor`); the other outputs (and rows of shards without records): sort
the ids (vectorised), locate (shard, record batch, row) with two ``searchsorted`` calls, and
one kernel call per output and shard touched.

Supported without pyarrow in the loop: fixed-width numeric, bool, temporal and dictionary
columns; ``list``/``large_list`` of those; ``binary``/``string`` (and their large variants).
Other columns (structs, fixed-size lists, float16, decimals, ...) are read for the batch with
pyarrow and converted by :mod:`stoker.loader.fastpath.convert`, so every column type still works.
Output is equal (dtypes, shapes, values) to the pyarrow path; nulls follow the rule documented
in :mod:`stoker.loader.fastpath.kernels` (numbers -> 0, lists -> empty).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa
import torch

from stoker.loader.fastpath import kernels as k
from stoker.loader.fastpath.images import ImageOptions, decode_into
from stoker.loader.fastpath.ipc_meta import FileBatches, IpcLayout, batch_rows, read_layout
from stoker.loader.fastpath.ring import BufferRing, Slot
from stoker.manifest import ShardIntegrityError

__all__ = ["FastPlan", "NotZeroCopy", "Output", "ShardData", "physical_code"]


class NotZeroCopy(Exception):
    """A shard's buffers are not inside its memory map (compressed, or unaligned)."""


def physical_code(t: pa.DataType) -> int | None:
    """The kernels' type code of a fixed-width column, or ``None`` if unsupported."""
    if pa.types.is_dictionary(t):
        t = t.index_type
    if pa.types.is_boolean(t):
        return k.BOOL
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return k.I32
    if pa.types.is_temporal(t):
        return k.I64 if t.bit_width == 64 else None
    if pa.types.is_integer(t) or pa.types.is_float32(t) or pa.types.is_float64(t):
        return k.CODES[np.dtype(t.to_pandas_dtype())]
    return None


def _plain_dtype(t: pa.DataType) -> np.dtype:
    """The dtype the pyarrow path gives a fixed-width column (see stoker.loader.fastpath.convert)."""
    if pa.types.is_dictionary(t) or pa.types.is_temporal(t):
        return np.dtype(np.int64)
    return np.dtype(t.to_pandas_dtype())


def _kind(t: pa.DataType) -> str:
    if physical_code(t) is not None:
        return "fixed"
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and \
            not pa.types.is_dictionary(t.value_type) and physical_code(t.value_type) is not None:
        return "list"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "binary"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    return "arrow"


@dataclass(frozen=True, slots=True)
class Output:
    """One declared output: ``name`` in the batch, ``kind``, source ``columns``, ``dtype``."""

    name: str
    kind: str  # "matrix" | "fixed" | "list" | "binary" | "string" | "arrow"
    columns: tuple[str, ...]
    dtype: np.dtype | None = None


class _Locator:
    """Byte offsets of Arrow buffers inside one arena (zero-copy) or a packed copy of them."""

    def __init__(self, arena: pa.Buffer | None) -> None:
        self.arena = arena
        self._packed: list[tuple[pa.Buffer, int]] = []
        self._seen: dict[int, int] = {}
        self._size = 0

    def offset(self, buf: pa.Buffer | None, align: int) -> int:
        if buf is None:
            return -1
        if self.arena is not None:
            off = buf.address - self.arena.address
            if off < 0 or off + buf.size > self.arena.size or off % align:
                raise NotZeroCopy(f"buffer at {buf.address:#x} is not an aligned part of the "
                                  "memory-mapped shard")
            return off
        if buf.address not in self._seen:  # pack: copy each distinct buffer once, 64-aligned
            self._seen[buf.address] = self._size
            self._packed.append((buf, self._size))
            self._size += (buf.size + 63) // 64 * 64
        return self._seen[buf.address]

    def finish(self) -> pa.Buffer:
        if self.arena is not None:
            return self.arena
        out = np.zeros(max(self._size, 64), dtype=np.uint8)
        for buf, off in self._packed:
            out[off:off + buf.size] = np.frombuffer(buf, dtype=np.uint8)
        return pa.py_buffer(out)


@functools.lru_cache(maxsize=None)
def _fixed_layout(t: pa.DataType) -> tuple[int, int, bool]:
    """(type code, value byte width, is dictionary) of a fixed-width column type."""
    code = physical_code(t)
    dictionary = pa.types.is_dictionary(t)
    value = t.index_type if dictionary else t
    return code, 1 if code == k.BOOL else value.bit_width // 8, dictionary  # type: ignore[return-value]


def _fixed_meta(arr: pa.Array, loc: _Locator) -> list[int]:
    code, width, dictionary = _fixed_layout(arr.type)
    if dictionary:
        arr = arr.indices
    bufs = arr.buffers()
    valid = loc.offset(bufs[0], 1) if arr.null_count else -1
    return [code, valid, loc.offset(bufs[1], width), arr.offset]


def _var_meta(arr: pa.Array, loc: _Locator) -> list[int]:
    bufs = arr.buffers()
    big = pa.types.is_large_list(arr.type) or pa.types.is_large_binary(arr.type) \
        or pa.types.is_large_string(arr.type)
    valid = loc.offset(bufs[0], 1) if arr.null_count else -1
    head = [valid, loc.offset(bufs[1], 8 if big else 4), int(big), arr.offset]
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        return head + _fixed_meta(arr.values, loc)
    return head + [loc.offset(bufs[2], 1)]


class ShardData:
    """Kernel inputs for one shard: arena views, record-batch row starts, column metadata.

    Args:
        batches: the shard's record batches (all with the same schema).
        arena: the memory-mapped file the batches were read from (zero-copy); ``None`` packs
            copies of the buffers into a new arena (tests, in-memory data).
        columns: the columns the plan reads with kernels.

    Raises:
        NotZeroCopy: a buffer lies outside ``arena`` (e.g. a compressed shard).
    """

    def __init__(self, batches: Sequence[pa.RecordBatch], arena: pa.Buffer | None,
                 columns: Sequence[str]) -> None:
        loc = _Locator(arena)
        rows = batch_rows(batches)
        self.starts = np.concatenate([[0], np.cumsum(rows, dtype=np.int64)]).astype(np.int64)
        # a memory-mapped IPC file lists every buffer's place itself: all columns' metadata
        # for all record batches at once (stoker.loader.fastpath.ipc_meta)
        if isinstance(batches, FileBatches) and arena is not None:
            layout: IpcLayout | None = batches.layout  # read from this arena's file
        else:
            layout = None if arena is None else read_layout(arena, batches[0].schema)
        if layout is not None and not np.array_equal(layout.rows, rows):
            layout = None  # not the file these batches were read from: ask pyarrow
        self.meta: dict[str, np.ndarray] = _ColumnMeta(batches, loc, layout)
        for name in columns:
            if layout is not None or arena is None \
                    or _kind(batches[0].schema.field(name).type) != "fixed":
                self.meta[name]  # noqa: B018 - computes and stores it (see below)
            else:  # zero-copy and fixed-width: check one record batch now (a compressed shard
                _column_meta(batches[:1], name, loc)  # fails here), the rest on first use
        # (packed copies need every buffer before the arena exists; variable-width columns may
        # have empty buffers outside the map in any record batch: both are computed now)
        self._arena = loc.finish()
        self.views = k.arena_views(self._arena)
        #: whether ``arena`` maps the shard's file (set by its opener): page-cache advice
        #: (stoker.loader.fastpath.advise) applies only then
        self.mapped = False
        self.random_advised = False

    @property
    def arena(self) -> pa.Buffer:
        """The memory the kernel views read: the shard's map, or the packed copies."""
        return self._arena

    def matrix_meta(self, columns: Sequence[str]) -> np.ndarray:
        """int64 ``[chunks, K, 4]`` for :func:`~stoker.loader.fastpath.kernels.gather_fixed`."""
        key = "\0matrix\0" + "\0".join(columns)
        if key not in self.meta:
            self.meta[key] = np.ascontiguousarray(np.stack([self.meta[c] for c in columns], 1))
        return self.meta[key]

    def matrix_meta_of(self, columns: Sequence[str], chunks: np.ndarray) -> np.ndarray:
        """:meth:`matrix_meta` of record batches ``chunks`` only (``[len(chunks), K, 4]``, not
        kept): a look at a few rows (stoker.loader.fastpath.record_check) then costs the
        metadata of the record batches it touches, not of all of them (~2.5 us per column
        and record batch)."""
        return np.ascontiguousarray(np.stack([self.meta.of_chunks(c, chunks) for c in columns], 1))


def _column_meta(batches: Sequence[pa.RecordBatch], name: str, loc: _Locator) -> np.ndarray:
    arrs = [b.column(name) for b in batches]
    fn = _fixed_meta if _kind(arrs[0].type) == "fixed" else _var_meta
    return np.array([fn(a, loc) for a in arrs], dtype=np.int64).reshape(len(arrs), -1)


def _layout_meta(layout: IpcLayout, name: str, t: pa.DataType) -> np.ndarray:
    """:func:`_column_meta` of column ``name`` (type ``t``), from the file's layout."""
    node, buffer = layout.first_node[name], layout.first_buffer[name]
    try:
        if _kind(t) == "fixed":
            return layout.fixed_meta(node, buffer, *_fixed_layout(t)[:2])
        big = pa.types.is_large_list(t) or pa.types.is_large_binary(t) \
            or pa.types.is_large_string(t)
        child = _fixed_layout(t.value_type)[:2] if _kind(t) == "list" else None
        return layout.var_meta(node, buffer, big, child)
    except ValueError as exc:  # unaligned: as _Locator.offset says it
        raise NotZeroCopy(str(exc)) from None


class _ColumnMeta(dict):  # type: ignore[type-arg]
    """Column name -> kernel metadata, computed on first access (see :class:`ShardData`).

    Holds the batches and the locator, never the :class:`ShardData`: a reference cycle would
    keep a closed shard's memory map (and, in a cache, its deleted file's disk space) alive
    until the garbage collector happens to run.
    """

    def __init__(self, batches: Sequence[pa.RecordBatch], loc: _Locator,
                 layout: IpcLayout | None = None) -> None:
        super().__init__()
        self._batches, self._loc, self._layout = batches, loc, layout

    def __missing__(self, name: str) -> np.ndarray:
        batches = self._batches
        schema = batches.schema if isinstance(batches, FileBatches) else batches[0].schema
        t = schema.field(name).type
        value = self[name] = _column_meta(self._batches, name, self._loc) \
            if self._layout is None or _kind(t) == "arrow" else _layout_meta(self._layout, name, t)
        return value

    def of_chunks(self, name: str, chunks: np.ndarray) -> np.ndarray:
        """Column ``name``'s metadata rows for record batches ``chunks`` (computed for those
        alone unless the whole column's is known or cheap: packed arenas know every
        column's, and a file's layout gives all record batches' at once)."""
        if name in self or self._layout is not None:
            return self[name][chunks]
        return _column_meta([self._batches[c] for c in chunks.tolist()], name, self._loc)


# (chunk, row, dest) of the rows of one shard, and that shard's data
_Group = tuple[ShardData, np.ndarray, np.ndarray, np.ndarray]


class FastPlan:
    """Declared outputs for (schema, columns, features, categoricals), and how to fill them.

    Args:
        schema: the dataset's Arrow schema.
        columns: columns in output order (``features``/``categoricals`` included).
        features: numeric columns -> ``"features"``, float32 ``[B, K]``.
        categoricals: integer or dictionary columns -> ``"categoricals"``, int64 ``[B, C]``.
    """

    def __init__(self, schema: pa.Schema, columns: Sequence[str], features: Sequence[str],
                 categoricals: Sequence[str], image: ImageOptions | None = None) -> None:
        self.image = image
        self.outputs: list[Output] = []
        if features:
            self.outputs.append(Output("features", "matrix", tuple(features), np.dtype(np.float32)))
        if categoricals:
            self.outputs.append(Output("categoricals", "matrix", tuple(categoricals),
                                       np.dtype(np.int64)))
        grouped = set(features) | set(categoricals)
        for name in columns:
            if name in grouped:
                continue
            t = schema.field(name).type
            kind = "image" if image is not None and name == image.column else _kind(t)
            dtype = _plain_dtype(t) if kind == "fixed" else \
                _plain_dtype(t.value_type) if kind == "list" else None
            self.outputs.append(Output(name, kind, (name,), dtype))
        self.kernel_columns = [c for o in self.outputs if o.kind != "arrow" for c in o.columns]
        self.arrow_columns = [o.name for o in self.outputs if o.kind == "arrow"]

    @staticmethod
    def supports(schema: pa.Schema, features: Sequence[str], categoricals: Sequence[str]) -> bool:
        """Whether ``features`` and ``categoricals`` can be gathered by the kernels."""
        ok_f = all(_kind(schema.field(c).type) == "fixed" for c in features)
        ok_c = all(_kind(schema.field(c).type) == "fixed"
                   and (pa.types.is_integer(schema.field(c).type)
                        or pa.types.is_dictionary(schema.field(c).type)) for c in categoricals)
        return ok_f and ok_c

    # -- running ------------------------------------------------------------------------------
    def groups(self, ids: np.ndarray, starts: np.ndarray,
               shard_data: Callable[[int], ShardData]) -> list[_Group]:
        """Split ``ids`` into per-shard (data, chunk, row, dest), rows sorted by position."""
        order = np.argsort(ids, kind="stable")
        sids = ids[order]
        shard = np.searchsorted(starts, sids, side="right") - 1
        local = sids - starts[shard]
        cuts = np.flatnonzero(np.diff(shard)) + 1
        out = []
        for lo, hi in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [len(ids)]])):
            data = shard_data(int(shard[lo]))
            rows = local[lo:hi]
            if rows[-1] >= data.starts[-1]:  # sorted: one comparison bounds the whole group
                raise ShardIntegrityError(
                    f"shard {int(shard[lo])}: row {int(rows[-1])} was asked for, the shard's "
                    f"record batches hold {int(data.starts[-1])} rows; the manifest's row "
                    "counts and the file disagree. Run `stoker verify`.")
            chunk = np.searchsorted(data.starts, rows, side="right") - 1
            out.append((data, chunk, rows - data.starts[chunk], order[lo:hi]))
        return out

    def run(self, groups: list[_Group], n: int, slot: Slot,
            arrow: Callable[[list[str]], dict[str, Any]],
            augment: tuple[np.ndarray, str, int, int] | None = None,
            filled: dict[str, np.ndarray] | None = None,
            rest: Sequence[_Group] = (), kernels: Any = k,
            arrays: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
        """Fill every output for one batch of ``n`` rows into ``slot``; ``arrow(columns)``
        converts the columns the kernels do not handle; ``augment`` is (ids, fingerprint,
        seed, epoch), all that image augmentation depends on.

        ``arrays``, if given, receives the NumPy array behind each fixed-width tensor of the
        batch, by batch key: the content digests hash them while they are still in cache
        (stoker.loader.ledger.digest.batch_digests).

        ``filled`` are outputs already written from row-major records
        (:mod:`stoker.loader.fastpath.rowmajor`) for every row but those of ``rest``, which the column
        kernels write here; ``groups`` (all rows) serve the other outputs. ``kernels``:
        :mod:`stoker.loader.fastpath.kernels`, or their NumPy twins (:mod:`stoker.loader.fastpath.kernels_np`)
        while the kernels compile.
        """
        batch: dict[str, Any] = {}
        arrays = {} if arrays is None else arrays
        filled = filled or {}
        fallback = arrow(self.arrow_columns) if self.arrow_columns else {}
        for out in self.outputs:
            if out.name in filled:
                arr = filled[out.name]
                for data, chunk, row, dest in rest:
                    kernels.gather_fixed(data.views, data.matrix_meta(out.columns), chunk, row, dest,
                                   arr)
                _tensor(batch, arrays, out.name, arr.reshape(n) if out.kind == "fixed" else arr)
            elif out.kind in ("matrix", "fixed"):
                arr = slot.array(out.name, (n, len(out.columns)), out.dtype)
                for data, chunk, row, dest in groups:
                    kernels.gather_fixed(data.views, data.matrix_meta(out.columns), chunk, row,
                                         dest, arr)
                _tensor(batch, arrays, out.name, arr.reshape(n) if out.kind == "fixed" else arr)
            elif out.kind == "list":
                self._list(out, groups, n, slot, batch, arrays, kernels)
            elif out.kind == "image":
                batch[out.name] = self._image(out, groups, n, slot, augment, kernels)
            elif out.kind in ("binary", "string"):
                batch[out.name] = self._binary(out, groups, n, slot, kernels)
            else:
                batch[out.name] = fallback[out.name]
                if f"{out.name}_lengths" in fallback:
                    batch[f"{out.name}_lengths"] = fallback[f"{out.name}_lengths"]
        return batch

    def _lengths(self, out: Output, groups: list[_Group], n: int, slot: Slot,
                 kernels: Any = k) -> np.ndarray:
        lengths = slot.array(out.name + "\0len", (n,), np.int64)
        for data, chunk, row, dest in groups:
            kernels.var_lengths(data.views, data.meta[out.name], chunk, row, dest, lengths)
        return lengths

    def _list(self, out: Output, groups: list[_Group], n: int, slot: Slot,
              batch: dict[str, Any], arrays: dict[str, np.ndarray], kernels: Any = k) -> None:
        lengths = self._lengths(out, groups, n, slot, kernels)
        np.maximum(lengths, 0, out=lengths)  # null list -> empty, as in the pyarrow path
        width = int(lengths.max()) if n else 0
        arr = slot.array(out.name, (n, width), out.dtype)
        for data, chunk, row, dest in groups:
            kernels.gather_list(data.views, data.meta[out.name], chunk, row, dest, arr)
        _tensor(batch, arrays, out.name, arr)
        if n and not (lengths == width).all():
            _tensor(batch, arrays, f"{out.name}_lengths", lengths)

    def _image(self, out: Output, groups: list[_Group], n: int, slot: Slot,
               augment: tuple[np.ndarray, str, int, int] | None,
               kernels: Any = k) -> torch.Tensor:
        opts = self.image
        assert opts is not None  # noqa: S101 - kind "image" exists only with options
        ids, fingerprint, seed, epoch = augment if augment is not None else \
            (np.zeros(n, np.int64), "", 0, 0)
        lengths = self._lengths(out, groups, n, slot, kernels)
        offsets, data = self.gather_bytes(out.name, groups, lengths, slot, kernels)
        arr = slot.array(out.name, (n, *opts.size, 3), opts.dtype)
        decode_into(opts, offsets, data, ids, arr, fingerprint, seed, epoch)
        return torch.from_numpy(arr)

    def _binary(self, out: Output, groups: list[_Group], n: int, slot: Slot,
                kernels: Any = k) -> list[Any]:
        lengths = self._lengths(out, groups, n, slot, kernels)
        offsets, data_bytes = self.gather_bytes(out.name, groups, lengths, slot, kernels)
        raw = data_bytes.tobytes()
        values: list[Any] = [raw[offsets[i]:offsets[i + 1]] for i in range(n)]
        if out.kind == "string":
            values = [v.decode("utf-8") for v in values]
        for i in np.flatnonzero(lengths < 0):
            values[i] = None
        return values

    @staticmethod
    def gather_bytes(name: str, groups: list[_Group], lengths: np.ndarray,
                     slot: Slot, kernels: Any = k) -> tuple[np.ndarray, np.ndarray]:
        """Offsets (int64 ``[n + 1]``) and bytes of a binary column, gathered in batch order."""
        n = len(lengths)
        offsets = slot.array(name + "\0off", (n + 1,), np.int64)
        offsets[0] = 0
        np.cumsum(np.maximum(lengths, 0), out=offsets[1:])
        data = slot.array(name + "\0bytes", (int(offsets[n]),), np.uint8)
        for shard, chunk, row, dest in groups:
            kernels.gather_binary(shard.views, shard.meta[name], chunk, row, dest, offsets, data)
        return offsets, data


def new_ring(depth: int = 8, pin: bool = False) -> BufferRing:
    """The ring an :class:`~stoker.loader.read.arrow.ArrowSource` fills batches into."""
    return BufferRing(depth, pin)


def _tensor(batch: dict[str, Any], arrays: dict[str, np.ndarray], name: str,
            arr: np.ndarray) -> None:
    """``batch[name]``: a tensor view of ``arr``, which ``arrays`` keeps for the digests."""
    batch[name] = torch.from_numpy(arr)
    arrays[name] = arr
