"""The DataLoader's option objects (``ShuffleOptions``, ``ReadOptions``, ``CacheOptions``,
``LedgerOptions``, ``WorkerOptions``) and how its keywords, old spellings included, become
one checked :class:`LoaderOptions`."""

from stoker.loader.options.groups import (CacheOptions, LedgerOptions, ReadOptions,
                                          ShuffleOptions, WorkerOptions)
from stoker.loader.options.resolve import (LoaderOptions, StokerDeprecationWarning,
                                           resolve_options)

__all__ = ["CacheOptions", "LedgerOptions", "LoaderOptions", "ReadOptions", "ShuffleOptions",
           "StokerDeprecationWarning", "WorkerOptions", "resolve_options"]
