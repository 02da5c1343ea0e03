"""stoker.serve: the data service. ``stoker serve`` computes batches by key for trainers.

A batch key (``stoker.loader.service.key``) names a batch of a stoker dataset completely, so a
server holds no cursor and any server can answer any key: the catalog turns a key into ids
(the order) and rows (the dataset's reader), the Flight server streams it with its digests,
the client (``DataLoader(..., workers=WorkerOptions(service=[...]))``, in stoker.loader) retries, hedges and checks.
Nothing imports this package but the command line (stoker.tools.cli.serve).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["BatchServer", "Catalog", "NamedTransform", "ServeError"]

_WHERE = {
    "BatchServer": "stoker.serve.server",
    "Catalog": "stoker.serve.catalog",
    "NamedTransform": "stoker.serve.transforms",
    "ServeError": "stoker.serve.catalog",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'stoker.serve' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
