"""The reading side of a mixture: one reader per source, batches merged back in stream order.

When the sources can share one reader (local stoker datasets with one schema and
compression, :mod:`stoker.loader.read.mixture_union`), a batch's mixture ids are read in one call.
Otherwise the ids (see :mod:`stoker.loader.order.mixture_order`) are split by source, each source's
reader (:class:`~stoker.loader.read.arrow.ArrowSource`, through its public
``fetch(ids, epoch, seed)``) reads its rows, and the parts are written back at their
positions; ``batch["source"]`` (int64) says which source (index into ``Mixture.names``) each
row came from. The sources must agree on the requested columns: same names, and types that
convert to the same batch value (see :func:`check_columns`). A shuffled mixture whose shared
reader's records exceed the records budget stages each source's rounds
(:mod:`stoker.loader.read.mixture_staging`), as one dataset would stage its own.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import torch

from stoker.loader.fallbacks import note
from stoker.loader.read.arrow import ArrowSource
from stoker.loader.jit.kernel import kernel
from stoker.loader.order.mixture import Mixture, MixtureError
from stoker.loader.order.mixture_file import is_mixture_file
from stoker.loader.order.mixture_kernel import source_of
from stoker.loader.order.mixture_order import MixtureOrder, PassOrders
from stoker.loader.read.mixture_future import mixture_clock
from stoker.loader.read.mixture_staging import MixtureStager
from stoker.loader.read.mixture_union import union_manifest
from stoker.loader.order.options import OrderOptions
from stoker.loader.fastpath import warm
from stoker.loader.fastpath.ring import BufferRing, Slot
from stoker.manifest import Manifest, ManifestError

__all__ = ["MixtureSource", "check_columns", "is_mixture", "reader_manifests"]

# Column types that convert to the same batch value (stoker.loader.fastpath.convert): offsets width
# and string-vs-binary storage do not change what a batch holds.
_SAME = {pa.large_string(): pa.string(), pa.large_binary(): pa.binary()}


def _batch_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_dictionary(t):
        return pa.int64()  # dictionary columns give their int64 codes
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return pa.list_(_batch_type(t.value_type))
    return _SAME.get(t, t)


def check_columns(mixture: Mixture, columns: Sequence[str] | None,
                  features: Sequence[str] | None, categoricals: Sequence[str] | None,
                  image: Any) -> None:
    """Raise :class:`MixtureError` naming the source, the column and both types unless every
    source can deliver the requested columns as the same batch values."""
    first, schema0 = mixture.names[0], mixture.manifests[0].arrow_schema
    wanted = list(columns) if columns is not None else list(schema0.names)
    grouped = set(features or ()) | set(categoricals or ())
    every = list(dict.fromkeys(wanted + list(features or ()) + list(categoricals or ())
                               + ([image.column] if image is not None else [])))
    for name, manifest in zip(mixture.names[1:], mixture.manifests[1:]):
        schema = manifest.arrow_schema
        if columns is None and set(schema.names) != set(schema0.names):
            extra = sorted(set(schema.names) ^ set(schema0.names))
            raise MixtureError(
                f"sources {first!r} and {name!r} have different columns (column {extra[0]!r} "
                f"is in only one); pass columns=[...] naming columns every source has "
                f"(common: {sorted(set(schema.names) & set(schema0.names))}).")
        for col in every:
            if col not in schema.names or col not in schema0.names:
                holder, lacking = (first, name) if col in schema0.names else (name, first)
                raise MixtureError(f"column {col!r} is in source {holder!r} but not in source "
                                   f"{lacking!r}; request only columns every source has.")
            if col in grouped:  # cast to float32 / int64 by the reader either way
                continue
            a, b = schema0.field(col).type, schema.field(col).type
            if _batch_type(a) != _batch_type(b):
                raise MixtureError(f"column {col!r} is {a} in source {first!r} but {b} in "
                                   f"source {name!r}; the batches would not match. Cast one "
                                   "of them when sharding, or leave the column out.")


def reader_manifests(mixture: Mixture, union: bool = True) -> list[tuple[str, Manifest]]:
    """``(name, manifest)`` of each reader a :class:`MixtureSource` reads through: one over
    every source's shards when they allow it (stoker.loader.read.mixture_union) and ``union``,
    else one per source; a single source is read through its own manifest, exactly as on
    its own."""
    if len(mixture.names) == 1:
        return [(mixture.names[0], mixture.manifests[0])]
    shared = union_manifest(mixture.manifests) if union else None
    return [("all", shared)] if shared is not None else list(zip(mixture.names,
                                                                 mixture.manifests))


class MixtureSource:
    """Batches of a mixture: dicts of column -> tensor (or list), plus ``"source"``.

    Args:
        mixture: the mixture.
        make_reader: builds the reader of one source's manifest and its shard cache (or
            ``None``; closed with the source); the DataLoader passes the read options it gives
            a single dataset.
        ring_depth, pin: the merged batches' buffers (as a reader's, see stoker.loader.fastpath.ring).
        named: the ``(name, manifest)`` of each reader to build (:func:`reader_manifests`, its
            default: one over every shard when the sources allow); the audit's reference
            rebuild passes one per source, so it does not share
            :mod:`stoker.loader.read.mixture_union` with what it checks.
    """

    kind = "mixture"

    def __init__(self, mixture: Mixture,
                 make_reader: Callable[[Manifest], tuple[ArrowSource, Any]], *,
                 ring_depth: int = 8, pin: bool = False,
                 named: list[tuple[str, Manifest]] | None = None) -> None:
        warm.prime_mixture()
        self.mixture = mixture
        self._ring = BufferRing(ring_depth, pin)
        self.fingerprint = mixture.fingerprint
        self.readers: list[ArrowSource] = []
        self._caches: list[Any] = []
        self._passes: PassOrders | None = None
        named = reader_manifests(mixture) if named is None else named
        self.union = len(named) == 1  # mixture ids are then the one reader's global ids
        self._reader_names = [name for name, _ in named]
        try:
            for name, manifest in named:
                try:
                    reader, cache = make_reader(manifest)
                except ManifestError as exc:
                    raise MixtureError(f"source {name!r}: {exc}") from None
                self.readers.append(reader)
                self._caches.append(cache)
        except BaseException:
            self.close()
            raise
        # the concatenated shards: their sum is an epoch's length; OrderOptions.resolve reads them
        self.shard_rows = np.concatenate([m.shard_rows for m in mixture.manifests]).astype(np.int64)
        self._offsets = mixture.offsets

    # -- order ----------------------------------------------------------------------------------
    def epoch_order(self, seed: int, epoch: int, options: OrderOptions) -> MixtureOrder:
        """The order of loader epoch ``epoch`` (the per-pass orders are shared and kept)."""
        passes = self._passes
        if passes is None or passes.seed != seed or passes.options != options:
            if passes is not None:
                passes.close()
            passes = self._passes = PassOrders([m.shard_rows for m in self.mixture.manifests],
                                               [m.fingerprint for m in self.mixture.manifests],
                                               seed, options)
        return MixtureOrder(self.mixture, passes, epoch)

    def stage(self, options: OrderOptions, rank: int, world_size: int) -> bool:
        """Stage a shuffled mixture's rounds, source by source
        (:mod:`stoker.loader.read.mixture_staging`), where its readers would stage one
        dataset's: the sources share one reader and their records exceed the records budget.
        Sources read through readers of their own (remote ones) are not staged: rows of
        shards without records are read from their columns, at a fraction of the staged rate,
        never silently: the counted, logged fallback ``"mixture_unstaged"`` names the reader,
        its records and the budget."""
        if not options.shuffle:
            return False
        if self.union:
            return self.readers[0].stage_with(options, lambda plan, runs_of, ahead: MixtureStager(
                plan, options, self.mixture, runs_of, ahead))
        for name, reader in zip(self._reader_names, self.readers):
            over = reader.records_over_budget()
            if over is not None:
                note("mixture_unstaged", f"mixture {self.mixture.names} reader {name!r}: "
                                         f"{over[0]} bytes of row-major records, budget "
                                         f"{over[1]} bytes")
        return False

    # -- reading --------------------------------------------------------------------------------
    def fetch(self, ids: np.ndarray, epoch: int = 0, seed: int = 0) -> dict[str, Any]:
        """The batch of mixture ids ``ids``, in their order, with ``"source"``."""
        ids = np.asarray(ids, dtype=np.int64)
        src = source_of(ids, self._offsets)
        if self.union:  # mixture ids are the union's global ids
            batch = self.readers[0].fetch(ids, epoch, seed)
            batch["source"] = torch.from_numpy(src)
            return batch
        present = np.unique(src).tolist()
        if len(present) <= 1:  # one source (or an empty share): its batch as it is
            i = present[0] if present else 0
            batch = self.readers[i].fetch(ids - self._offsets[i], epoch, seed)
            batch["source"] = torch.from_numpy(src)
            return batch
        parts = [(rows, self.readers[i].fetch(local, epoch, seed))
                 for i, rows, local in self._shares(ids, src, present)]
        slot = self._ring.acquire()
        try:
            batch = _merge(parts, len(ids), slot)
        finally:
            self._ring.release(slot)
        batch["source"] = torch.from_numpy(src)
        return batch

    def fetch_digested(self, ids: np.ndarray, epoch: int, seed: int,
                       digest: Any) -> tuple[dict[str, Any], Any]:
        """:meth:`fetch` and the ledger's ``digest(batch, arrays)``: through the shared
        reader's fast path when the sources share one (its arrays, hashed while in cache;
        ``"source"`` from its tensor), else on the merged batch (no arrays: every column
        from its tensor). The same digests either way (stoker.loader.ledger.digest)."""
        ids = np.asarray(ids, dtype=np.int64)
        if digest is None or not self.union:
            batch = self.fetch(ids, epoch, seed)
            return batch, None if digest is None else digest(batch, {})
        column = torch.from_numpy(source_of(ids, self._offsets))

        def with_source(batch: dict[str, Any], arrays: Any) -> Any:
            batch["source"] = column
            return digest(batch, arrays)

        batch, digests = self.readers[0].fetch_digested(ids, epoch, seed, with_source)
        batch["source"] = column
        return batch, digests

    @property
    def group_rows(self) -> int:
        """Rows a worker reads as one group (ArrowSource.group_rows): sources that
        share one reader only."""
        return self.readers[0].group_rows if self.union else 0

    def fetch_group(self, batches: Sequence[np.ndarray], epoch: int, seed: int,
                    digest: Any, into: Any = None) -> list[tuple[dict[str, Any], Any]] | None:
        """:meth:`fetch_digested` of several batches from the shared reader's one record
        gather (ArrowSource.fetch_group), each with its ``"source"``; ``None`` when they
        cannot be read at once."""
        if not self.union:
            return None
        # one kernel call for the group, and each batch's column a NumPy view: a torch call
        # such as ``split`` releases and retakes the GIL, a wait behind the other threads
        # (W1, 2 thread workers: the mixture read 82 % of the single source with ``split``,
        # 89 % with views; bench/mixture_bench.py)
        src = source_of(np.concatenate([np.asarray(b, dtype=np.int64) for b in batches]),
                        self._offsets)
        ends = np.cumsum([len(b) for b in batches]).tolist()
        columns = [torch.from_numpy(src[lo:hi]) for lo, hi in zip([0, *ends], ends)]
        pending = iter(columns)  # the reader digests the batches in order

        def with_source(batch: dict[str, Any], arrays: Any) -> Any:
            batch["source"] = next(pending)
            return digest(batch, arrays)

        got = self.readers[0].fetch_group(batches, epoch, seed,
                                          None if digest is None else with_source, into)
        if got is None:
            return None
        for (batch, _), column in zip(got, columns):
            batch["source"] = column
        return got

    def open_for_workers(self, ids: Sequence[np.ndarray], wait: bool = True) -> None:
        """Each reader opens the shards of its share of ``ids`` for worker processes
        (ArrowSource.open_for_workers)."""
        if not any(r.opens_ahead for r in self.readers):
            return
        if self.union:
            self.readers[0].open_for_workers(ids, wait)
            return
        ids = np.concatenate(ids)
        src = source_of(ids, self._offsets)
        for i, _, local in self._shares(ids, src, np.unique(src).tolist()):
            self.readers[i].open_for_workers([local], wait)

    def _shares(self, ids: np.ndarray, src: np.ndarray,
                present: list[int]) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """``(source, rows of ids, its own ids)`` for each source in ``present``."""
        for i in present:
            rows = np.flatnonzero(src == i)
            yield i, rows, ids[rows] - self._offsets[i]

    def cache_clock(self, order: MixtureOrder, plan: Any,
                    step: int) -> Callable[[int], None] | None:
        """Hand each source's shard cache this rank's future from ``step`` on
        (:mod:`stoker.loader.read.mixture_future`); ``None`` when the sources share one
        reader (then local: no cache to tell)."""
        if len(self.readers) != len(self.mixture.names):  # one reader over every source
            return None
        return mixture_clock(self._caches, order, plan, step)

    def close(self) -> None:
        """Close every source's reader and shard cache, and stop the order's background
        thread; idempotent."""
        if self._passes is not None:
            self._passes.close()
        for r in self.readers:
            r.close()
        for c in self._caches:
            if c is not None:
                c.close()
        self._caches = [None] * len(self._caches)


@kernel
def _scatter(dst, src, rows):  # type: ignore[no-untyped-def]
    """``dst[rows[r]] = src[r]`` for byte rows (any dtype, viewed as uint8)."""
    width = src.shape[1]
    for r in range(rows.shape[0]):
        d = rows[r]
        for b in range(width):
            dst[d, b] = src[r, b]


def _merge(parts: list[tuple[np.ndarray, dict[str, Any]]], n: int, slot: Slot) -> dict[str, Any]:
    """One batch of ``n`` rows from per-source batches whose rows sit at ``rows``; tensors
    are written into ``slot``'s buffers (reused, pinned when the readers' are)."""
    out: dict[str, Any] = {}
    keys = list(dict.fromkeys(k for _, b in parts for k in b))
    for key in keys:
        if key.endswith("_lengths") and key[:-len("_lengths")] in keys:
            continue  # merged with its list column
        values = [b[key] for _, b in parts]
        if isinstance(values[0], torch.Tensor):
            _merge_tensor(out, key, parts, values, n, slot)
        else:
            merged: list[Any] = [None] * n
            for (rows, _), v in zip(parts, values):
                for r, item in zip(rows.tolist(), v):
                    merged[r] = item
            out[key] = merged
    return out


def _merge_tensor(out: dict[str, Any], key: str, parts: list[tuple[np.ndarray, dict]],
                  values: list[torch.Tensor], n: int, slot: Slot) -> None:
    """Scatter tensors; list columns of different widths are padded with 0 (as the
    conversion rules pad rows within one batch) and get ``<key>_lengths``."""
    lengths_key = f"{key}_lengths"
    ragged = any(lengths_key in b for _, b in parts)
    widths = {tuple(v.shape[1:]) for v in values}
    shape = max(widths)
    if len(widths) > 1 and (len(shape) != 1 or any(len(w) != 1 for w in widths)):
        raise MixtureError(f"column {key!r} has shapes {sorted(widths)} in different sources; "
                           "they cannot be stacked into one batch.")
    dtype = values[0].numpy().dtype
    merged = slot.array(key, (n, *shape), dtype)
    if len(widths) > 1:
        merged[...] = 0
    for (rows, _), v in zip(parts, values):
        a = np.ascontiguousarray(v.numpy())
        if tuple(a.shape[1:]) == shape:
            _scatter(merged.reshape(n, -1).view(np.uint8), a.reshape(len(rows), -1).view(np.uint8),
                     rows)
        else:
            merged[rows, :a.shape[1]] = a
    out[key] = torch.from_numpy(merged)
    if ragged or len(widths) > 1:
        lengths = torch.empty(n, dtype=torch.int64)
        for (rows, b), v in zip(parts, values):
            own = b.get(lengths_key)
            lengths[torch.from_numpy(rows)] = own if own is not None else v.shape[1]
        out[lengths_key] = lengths


def is_mixture(dataset: Any) -> bool:
    """Whether a DataLoader's ``dataset`` is a mixture (a Mixture or a ``mixture.json``)."""
    return isinstance(dataset, Mixture) or is_mixture_file(dataset)
