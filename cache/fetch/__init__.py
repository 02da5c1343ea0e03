"""Getting a shard's bytes: one download with capped, jittered retries, from any backend.

``download`` (the retry loop and the fetcher interface), ``http`` (ranged GETs),
``fsspec`` (``s3://``, ``gs://``, ... and local copies), ``backends`` (which one serves a
root) and ``retry`` (:class:`RetryPolicy`). Nothing here knows the store the bytes go to.
"""

from stoker.cache.fetch.backends import fetcher_for
from stoker.cache.fetch.download import Fetcher, download
from stoker.cache.fetch.retry import RetryPolicy

__all__ = ["Fetcher", "RetryPolicy", "download", "fetcher_for"]
