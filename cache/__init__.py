"""stoker.cache: node-local shard store: fetch once per node, verify, materialise, evict.

``ShardCache`` knows manifests and bytes, never samples. See ``shard_cache.py`` for how
processes share one cache directory, and ``layout.py`` for what lives where.
"""

from stoker.cache.dataset import default_cache_dir, open_dataset
from stoker.cache.errors import CacheError, CacheLimitError, RemoteFetchError
from stoker.cache.retry import RetryPolicy
from stoker.cache.shard_cache import ShardCache
from stoker.cache.size import parse_size
from stoker.cache.stats import CacheStats

__all__ = [
    "CacheError",
    "CacheLimitError",
    "CacheStats",
    "RemoteFetchError",
    "RetryPolicy",
    "ShardCache",
    "default_cache_dir",
    "open_dataset",
    "parse_size",
]
