"""Read samples of a stoker dataset by global id: memory-mapped shards, vectorised takes.

A global sample id is the sample's index in the concatenation of the manifest's shards.
Reading a batch groups its ids by shard, takes the rows from each memory-mapped shard
(zero-copy for uncompressed shards), and restores the requested order with one more take.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from stoker.loader.convert import stack_features, table_to_batch
from stoker.loader.errors import WorkerError
from stoker.manifest import Manifest, ManifestError, redact_url

__all__ = ["ArrowSource", "ShardOpener"]

# Opens shard `index` and yields a local path that stays valid inside the context.
ShardOpener = Callable[[int], AbstractContextManager[str]]


class ArrowSource:
    """Batches of a stoker dataset, as dicts of column name -> tensor (or list).

    Args:
        manifest: the dataset.
        columns: columns to read (default: all).
        features: numeric columns stacked into one float32 ``[B, K]`` tensor under
            ``"features"`` (and not returned separately).
        opener: how to get a local file for a shard (the cache passes its own); by default
            the manifest's own location, which must then be local.
        max_open: shards kept open (memory maps are cheap; this bounds file handles).
    """

    kind = "stoker"

    def __init__(self, manifest: Manifest, *, columns: Sequence[str] | None = None,
                 features: Sequence[str] | None = None, opener: ShardOpener | None = None,
                 max_open: int = 256) -> None:
        names = manifest.arrow_schema.names
        for what, given in (("columns", columns), ("features", features)):
            unknown = [c for c in (given or ()) if c not in names]
            if unknown:
                raise ManifestError(f"{what}={list(given or ())!r}: no column named "
                                    f"{unknown[0]!r} in this dataset; its columns are {names}.")
        self.manifest = manifest
        self.fingerprint = manifest.fingerprint
        self.shard_rows = manifest.shard_rows
        self._starts = np.concatenate([[0], np.cumsum(self.shard_rows)]).astype(np.int64)
        self.features = list(features or ())
        wanted = list(columns) if columns is not None else list(names)
        self.columns = list(dict.fromkeys(wanted + self.features))
        self._opener = opener or self._local_opener
        self._open: OrderedDict[int, tuple[pa.Table, AbstractContextManager[str]]] = OrderedDict()
        self._max_open = max_open
        self._lock = threading.Lock()
        self.opened_shards: set[int] = set()

    # -- shard access ---------------------------------------------------------------------
    def _local_opener(self, index: int) -> AbstractContextManager[str]:
        location = self.manifest.shard_location(index)
        if "://" in location and not location.startswith("file://"):
            raise ManifestError(f"{redact_url(location)}: remote shards need a cache; pass "
                                "cache_dir=... to the DataLoader.")
        return nullcontext(location.removeprefix("file://"))

    def _table(self, index: int) -> pa.Table:
        with self._lock:
            entry = self._open.get(index)
            if entry is not None:
                self._open.move_to_end(index)
                return entry[0]
        # The opener's context (a cache pin) stays entered while the shard is open here.
        handle = self._opener(index)
        path = handle.__enter__()
        try:
            reader = pa.ipc.open_file(pa.memory_map(path, "r"))
            table = reader.read_all().select(self.columns)
            if self.manifest.compression != "none":
                table = table.combine_chunks()  # decompress once, not once per take
        except BaseException:
            handle.__exit__(None, None, None)
            raise
        closing = []
        with self._lock:
            self.opened_shards.add(index)
            if index in self._open:  # another worker opened it meanwhile
                closing.append(handle)
                table = self._open[index][0]
            else:
                self._open[index] = (table, handle)
            while len(self._open) > self._max_open:
                closing.append(self._open.popitem(last=False)[1][1])
        for h in closing:
            h.__exit__(None, None, None)
        return table

    # -- reading --------------------------------------------------------------------------
    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard index, row within shard) of each global id."""
        shard = np.searchsorted(self._starts, ids, side="right") - 1
        return shard, ids - self._starts[shard]

    def take(self, ids: np.ndarray) -> pa.Table:
        """Rows ``ids`` (global) as one Arrow table, in the given order."""
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) == 0:
            return self.manifest.arrow_schema.empty_table().select(self.columns)
        shard, row = self.locate(ids)
        by_shard = np.argsort(shard, kind="stable")
        bounds = np.flatnonzero(np.diff(shard[by_shard])) + 1
        pieces = []
        for group in np.split(by_shard, bounds):
            s = int(shard[group[0]])
            try:
                pieces.append(self._table(s).take(pa.array(row[group])))
            except Exception as exc:  # name the shard and samples, keep the cause
                path = redact_url(self.manifest.shard_location(s))
                raise WorkerError(f"reading shard {s} ({path}) for samples "
                                  f"{ids[group][:8].tolist()}{'...' if len(group) > 8 else ''} "
                                  f"failed: {type(exc).__name__}: {exc}") from exc
        table = pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]
        if len(pieces) > 1:
            inverse = np.empty_like(by_shard)
            inverse[by_shard] = np.arange(len(by_shard))
            table = table.take(pa.array(inverse))
        return table

    def fetch(self, ids: np.ndarray) -> dict[str, Any]:
        """The batch dict for ``ids``: ``features`` stacked, other columns converted."""
        table = self.take(ids)
        batch: dict[str, Any] = {}
        if self.features:
            batch["features"] = stack_features(table, self.features)
            table = table.drop_columns(self.features)
        batch.update(table_to_batch(table))
        return batch

    def close(self) -> None:
        """Release every open shard (and its cache pin); idempotent."""
        with self._lock:
            entries = list(self._open.values())
            self._open.clear()
        for _, handle in entries:
            handle.__exit__(None, None, None)
