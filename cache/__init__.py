"""stoker.cache: node-local shard store: fetch once per node, verify, materialise, evict.

``ShardCache`` knows manifests and bytes, never samples. :mod:`stoker.cache.fetch` gets a
shard's bytes from any backend; :mod:`stoker.cache.store` keeps them: see
:mod:`stoker.cache.store.shard_cache` for how processes share one cache directory, and
:mod:`stoker.cache.store.layout` for what lives where.
"""

from stoker.cache.dataset import default_cache_dir, open_dataset, open_shard_cache
from stoker.cache.errors import CacheError, CacheLimitError, RemoteFetchError
from stoker.cache.fetch.retry import RetryPolicy
from stoker.cache.stats import CacheStats
from stoker.cache.store.shard_cache import ShardCache
from stoker.manifest import parse_size

__all__ = [
    "CacheError",
    "CacheLimitError",
    "CacheStats",
    "RemoteFetchError",
    "RetryPolicy",
    "ShardCache",
    "default_cache_dir",
    "open_dataset",
    "open_shard_cache",
    "parse_size",
]
