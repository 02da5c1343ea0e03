"""The DataLoader's source in service mode: the dataset's manifest, no shards, a client.

A loader with ``service=`` needs what the order, the state and the ledger need (fingerprint,
row counts, the read options that shape a batch) but never opens a shard: its batches come
from ``stoker serve`` (stoker.loader.service.pool). Read options are resolved exactly as
:class:`~stoker.loader.read.arrow.ArrowSource` resolves them, so the ledger's content header
and the servers' batches match a local loader's.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from stoker.loader.ledger.digest import content_header
from stoker.loader.fastpath.images import ImageOptions
from stoker.loader.read.columns import check_column_names
from stoker.loader.service.client import ServiceClient
from stoker.loader.service.options import Service
from stoker.manifest import Manifest, ManifestError

__all__ = ["ServiceSource"]


class ServiceSource:
    """A stoker dataset read through the data service (see module docstring)."""

    kind = "stoker"

    def __init__(self, manifest: Manifest, service: Service, *,
                 columns: Sequence[str] | None = None, features: Sequence[str] | None = None,
                 categoricals: Sequence[str] | None = None,
                 image: ImageOptions | None = None) -> None:
        check_column_names(manifest, columns, features, categoricals)
        names = manifest.arrow_schema.names
        if image is not None and image.column not in names:
            raise ManifestError(f"image column {image.column!r} is not in this dataset; "
                                f"its columns are {names}.")
        if image is not None:
            t = manifest.arrow_schema.field(image.column).type
            if not (pa.types.is_binary(t) or pa.types.is_large_binary(t)):
                raise ValueError(f"ImageOptions.column={image.column!r} is {t}; it must be a "
                                 "binary column of encoded JPEG/PNG images.")
        self.manifest = manifest
        self.fingerprint = manifest.fingerprint
        self.shard_rows = manifest.shard_rows
        self._starts = np.concatenate([[0], np.cumsum(self.shard_rows)]).astype(np.int64)
        self.features = list(features or ())
        self.categoricals = list(categoricals or ())
        wanted = list(columns) if columns is not None else list(names)
        self.columns = list(dict.fromkeys(wanted + self.features + self.categoricals))
        self.image = image
        if image is not None and image.column not in self.columns:
            self.columns.append(image.column)
        self.service = service
        self.read = content_header(self)["read"]
        self._client: ServiceClient | None = None

    def client(self, check: Any) -> ServiceClient:
        """The (one, long-lived) client of this loader's servers."""
        if self._client is None:
            self._client = ServiceClient(self.service, check)
        elif check is not None:
            self._client.check = check
        return self._client

    def describe(self) -> dict[str, Any]:
        """What the ledger header records: the servers and the transform with its version
        (asked of the first server that answers its status)."""
        from stoker.manifest import redact_url

        transform: dict[str, Any] | None = None
        if self.service.transform is not None:
            transform = {"name": self.service.transform, "version": None}
            client = self.client(None)
            for url in self.service.urls:
                status = client.status(url)
                found = [t for t in (status or {}).get("transforms", [])
                         if t["name"] == self.service.transform]
                if found:
                    transform["version"] = found[0]["version"]
                    break
        return {"urls": [redact_url(u) for u in self.service.urls], "transform": transform}

    def shard_of(self, ids: np.ndarray) -> int:
        """The routing affinity of a batch: the shard of its first sample (-1 when empty)."""
        if not len(ids):
            return -1
        return int(np.searchsorted(self._starts, int(ids[0]), side="right") - 1)

    def fetch(self, ids: np.ndarray, epoch: int = 0, seed: int = 0) -> Any:
        raise TypeError("a service-mode source reads batches by key through the data service "
                        "(stoker.loader.service.pool), not by ids.")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
