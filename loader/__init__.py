"""stoker.loader: the order contract, workers, resume, and the drop-in DataLoader.

``DataLoader`` and the errors are imported lazily, so order-only users (the audit's replay,
the cache's planner) do not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["CacheOptions", "DataLoader", "ImageOptions", "LedgerOptions", "LoaderError",
           "LoaderTimeoutError", "Mixture", "MixtureError", "OptionsError", "ReadOptions",
           "ShuffleOptions", "StateError", "StokerDeprecationWarning", "WorkerError",
           "WorkerOptions"]

_WHERE = {
    "CacheOptions": "stoker.loader.options",
    "DataLoader": "stoker.loader.dataloader",
    "ImageOptions": "stoker.loader.fastpath.images",
    "LedgerOptions": "stoker.loader.options",
    "LoaderError": "stoker.loader.errors",
    "LoaderTimeoutError": "stoker.loader.errors",
    "Mixture": "stoker.loader.order.mixture",
    "MixtureError": "stoker.loader.order.mixture",
    "OptionsError": "stoker.loader.errors",
    "ReadOptions": "stoker.loader.options",
    "ShuffleOptions": "stoker.loader.options",
    "StateError": "stoker.loader.errors",
    "StokerDeprecationWarning": "stoker.loader.options",
    "WorkerError": "stoker.loader.errors",
    "WorkerOptions": "stoker.loader.options",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'stoker.loader' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
