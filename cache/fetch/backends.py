"""Which :class:`~stoker.cache.fetch.download.Fetcher` serves a dataset root.

``http(s)://`` gets our own ranged GETs (:mod:`stoker.cache.fetch.http`), a local path or
``file://`` a plain copy, any other scheme (``s3://``, ``gs://``, ...) fsspec
(:mod:`stoker.cache.fetch.fsspec`).
"""

from __future__ import annotations

from typing import Any, Mapping
from urllib.parse import urlsplit

from stoker.cache.fetch.download import Fetcher
from stoker.cache.fetch.fsspec import FsspecFetcher, LocalFetcher
from stoker.cache.fetch.http import HttpFetcher
from stoker.cache.fetch.retry import RetryPolicy
from stoker.manifest import is_url

__all__ = ["fetcher_for"]


def fetcher_for(root: str, storage_options: Mapping[str, Any] | None,
                policy: RetryPolicy) -> Fetcher:
    """The fetcher for shards under ``root`` (``storage_options``: credentials, headers)."""
    scheme = urlsplit(root).scheme.lower() if is_url(root) else ""
    if scheme in ("http", "https"):
        return HttpFetcher(storage_options, policy)
    if scheme in ("", "file"):
        return LocalFetcher()
    return FsspecFetcher(storage_options)
