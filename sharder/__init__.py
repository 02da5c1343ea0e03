"""stoker.sharder: any source -> deterministic Arrow IPC shards + a stoker/1 manifest.

Plan, then execute: :func:`shard` decides everything from the inputs and options first,
then writes every shard independently, so the output is byte-identical for any worker count.
"""

from stoker.manifest import format_size, parse_size
from stoker.sharder.errors import ShardOptionsError, SharderError
from stoker.sharder.executor import Executor, LocalExecutor
from stoker.sharder.options import BATCH_BYTES, BATCH_ROWS, DEFAULT_SHARD_SIZE, ShardOptions
from stoker.sharder.sharding import shard

__all__ = [
    "BATCH_BYTES",
    "BATCH_ROWS",
    "DEFAULT_SHARD_SIZE",
    "Executor",
    "LocalExecutor",
    "ShardOptions",
    "ShardOptionsError",
    "SharderError",
    "format_size",
    "parse_size",
    "shard",
]
