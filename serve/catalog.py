"""What a server serves: the datasets named on its command line, and key -> batch.

A key names its dataset by fingerprint; the catalog answers only for the datasets it was
started with (a client can never name a path). For a key it builds (and keeps a few of) the
epoch's order and a reader per set of read options, computes the ids exactly as the local
loader does (``BatchKey.ids``), reads the rows through the reader (the node's row-major
records and the fast path, a shard cache for remote datasets), runs the named transform if
the key asks for one, and returns the batch with the facts the client checks.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any, Callable, Mapping, Sequence

from stoker.loader.read.arrow import ArrowSource
from stoker.loader.ledger.digest import batch_digests, content_header
from stoker.loader.order.epoch import EpochOrder
from stoker.loader.workers.sample_rng import batch_seed
from stoker.loader.service.key import BatchKey, image_options
from stoker.loader.service.wire import digest_columns, ids_digest
from stoker.loader.workers.info import user_code
from stoker.manifest import Manifest, StokerError, redact_url
from stoker.serve.transforms import NamedTransform

__all__ = ["Catalog", "ServeError"]

_KEEP_ORDERS = 16
_KEEP_READERS = 4


class ServeError(StokerError, ValueError):
    """A request this server refuses: a dataset it does not serve, a transform it was not
    started with, a key whose options do not fit the dataset."""


class _Dataset:
    """One served dataset: its manifest, readers by read options, orders by epoch."""

    def __init__(self, location: str, manifest: Manifest,
                 reader: Callable[[Manifest, Mapping[str, Any]], Any]) -> None:
        self.location, self.manifest = location, manifest
        self._reader = reader
        self._readers: OrderedDict[str, Any] = OrderedDict()
        self._orders: OrderedDict[tuple[Any, ...], EpochOrder] = OrderedDict()
        self._lock = threading.Lock()

    def order(self, key: BatchKey) -> EpochOrder:
        options = key.order_options()
        ident = (key.seed, key.epoch, options)
        with self._lock:
            order = self._orders.get(ident)
            if order is not None:
                self._orders.move_to_end(ident)
                return order
        order = EpochOrder(self.manifest.shard_rows, self.manifest.fingerprint, key.seed,
                           key.epoch, options)
        if order.options != options:
            raise ServeError(f"batch key order options {dict(key.order)} are not resolved for "
                             f"this dataset (it resolves them to {order.options.to_dict()}); "
                             "send the loader's order_options.to_dict().")
        with self._lock:
            self._orders[ident] = order
            while len(self._orders) > _KEEP_ORDERS:
                self._orders.popitem(last=False)
        return order

    def reader(self, read: Mapping[str, Any]) -> Any:
        ident = json.dumps(read, sort_keys=True)
        with self._lock:
            found = self._readers.get(ident)
            if found is not None:
                self._readers.move_to_end(ident)
                return found
            made = self._reader(self.manifest, read)
            self._readers[ident] = made
            while len(self._readers) > _KEEP_READERS:
                self._readers.popitem(last=False)[1].close()
            return made

    def close(self) -> None:
        with self._lock:
            readers, self._readers = list(self._readers.values()), OrderedDict()
        for r in readers:
            r.close()


class Catalog:
    """The datasets and transforms of one server (see the module docstring).

    Args:
        locations: dataset paths or URLs (each holds ``manifest.json``).
        transforms: the transforms a key may name.
        cache_dir, cache_limit, storage_options: the node's shard cache for remote datasets.
    """

    def __init__(self, locations: Sequence[str], transforms: Sequence[NamedTransform] = (),
                 cache_dir: str | None = None, cache_limit: int | str | None = None,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        if not locations:
            raise ServeError("stoker serve needs at least one DATASET to serve.")
        self._cache_args = (cache_dir, cache_limit, storage_options)
        self._caches: list[Any] = []
        self.datasets: dict[str, _Dataset] = {}
        for location in locations:
            manifest = Manifest.load(location, storage_options)
            fp = manifest.fingerprint
            if fp in self.datasets:
                raise ServeError(f"{location} and {self.datasets[fp].location} are the same "
                                 f"dataset (fingerprint {fp}); name it once.")
            self.datasets[fp] = _Dataset(location, manifest, self._make_reader)
        self.transforms = {t.name: t for t in transforms}

    def _make_reader(self, manifest: Manifest, read: Mapping[str, Any]) -> ArrowSource:
        opener, cache = None, None
        root = manifest.root or ""
        remote = "://" in root and not root.startswith("file://")
        if remote or self._cache_args[0] is not None:
            from stoker.loader.read.remote import open_cache

            cache_dir, limit, storage = self._cache_args
            cache, opener = open_cache(manifest, cache_dir, limit, storage, 64)
            self._caches.append(cache)
        try:
            return ArrowSource(manifest, columns=read["columns"], features=read["features"],
                               categoricals=read["categoricals"], image=image_options(read),
                               opener=opener, max_open=64 if opener else 256, ring_depth=16)
        except StokerError as exc:
            raise ServeError(f"batch key read options {dict(read)}: {exc}") from None

    def describe(self) -> list[dict[str, Any]]:
        return [{"fingerprint": fp, "location": redact_url(d.location),
                 "num_samples": int(d.manifest.shard_rows.sum()),
                 "shards": int(d.manifest.num_shards)} for fp, d in self.datasets.items()]

    def batch(self, key: BatchKey) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(batch, facts)`` of ``key`` (facts: what the client checks, see service_wire)."""
        ds = self.datasets.get(key.dataset)
        if ds is None:
            served = ", ".join(f"{fp} ({redact_url(d.location)})"
                               for fp, d in self.datasets.items())
            raise ServeError(f"dataset fingerprint {key.dataset!r} is not served here; this "
                             f"server serves {served}. Start a server with that dataset.")
        transform = None
        if key.transform is not None:
            transform = self.transforms.get(key.transform)
            if transform is None:
                raise ServeError(f"transform {key.transform!r} is not served here (started "
                                 f"with {sorted(self.transforms) or 'no --transform'}).")
        order = ds.order(key)
        ids = key.ids(order)
        source = ds.reader(key.read)
        batch = source.fetch(ids, key.epoch, key.seed)
        columns = content_header(source)["columns"]
        content = batch_digests(batch, columns)
        facts: dict[str, Any] = {"ids": ids_digest(ids), "step": key.step,
                                 "transform": None if transform is None else
                                 transform.describe()}
        if transform is None:
            facts.update(digest_columns=columns, digests=content)
            return batch, facts
        with user_code(True) as call:  # seeded from the batch, as a local loader seeds it
            call.seed(batch_seed(key.seed, key.epoch, ids))
            sent = transform.fn(batch)
        names = digest_columns(sent) if isinstance(sent, Mapping) else []
        facts.update(digest_columns=names, digests=batch_digests(sent, names), content=content)
        return sent, facts

    def close(self) -> None:
        for ds in self.datasets.values():
            ds.close()
        for cache in self._caches:
            cache.close()
