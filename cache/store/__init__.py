"""The node-local store of verified shards: :class:`ShardCache` and the parts it is made of.

``layout`` (where files live), ``sidecar``, ``repair`` and ``trust`` (what vouches for a
file: start-up repair, quarantine, the re-hash on hand-out), ``budget`` and ``limits`` (the
byte budget), ``future`` and ``eviction`` (Belady's order), ``install`` (download, verify,
materialise, commit one shard), ``materialise`` (the uncompressed rewrite), ``prefetch``
(fetching ahead of need) and ``redact`` (secrets kept out of messages).
"""

from stoker.cache.store.shard_cache import ShardCache

__all__ = ["ShardCache"]
