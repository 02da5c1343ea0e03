"""Server-side transforms, only by name: ``--transform module:function``.

The server imports the module itself (code never travels over the wire, nothing is
unpickled) and reports the transform's version with every batch, so the trainer's ledger
records which code produced its bytes. The version is the top package's installed version
(``importlib.metadata``), else the module's ``__version__``, else the xxh3-64 of its source
file (``"source:<hex>"``): a changed function under the same name changes the version.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass
from typing import Any, Callable

import xxhash

from stoker.manifest import StokerError

__all__ = ["NamedTransform", "TransformError"]


class TransformError(StokerError, ValueError):
    """A ``--transform`` name that cannot be loaded."""


@dataclass(frozen=True)
class NamedTransform:
    """A batch transform the server runs, with the name and version it is known by."""

    name: str
    version: str
    fn: Callable[[Any], Any]

    @classmethod
    def load(cls, name: str) -> "NamedTransform":
        module_name, _, attr = name.partition(":")
        if not module_name or not attr:
            raise TransformError(f"--transform {name!r} must be 'module:function', e.g. "
                                 "'mypkg.augment:batch'.")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise TransformError(f"--transform {name!r}: cannot import {module_name!r} ({exc});"
                                 " install it on the server or fix PYTHONPATH.") from None
        fn = getattr(module, attr, None)
        if not callable(fn):
            raise TransformError(f"--transform {name!r}: module {module_name!r} has no "
                                 f"function {attr!r}.")
        return cls(name, _version(module), fn)

    def describe(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version}


def _version(module: Any) -> str:
    top = module.__name__.split(".")[0]
    try:
        return f"{top}=={importlib.metadata.version(top)}"
    except importlib.metadata.PackageNotFoundError:
        pass
    if isinstance(getattr(module, "__version__", None), str):
        return f"{module.__name__}=={module.__version__}"
    path = getattr(module, "__file__", None)
    if path is None:
        return "unknown"
    with open(path, "rb") as f:
        return f"source:{xxhash.xxh3_64_hexdigest(f.read())}"
