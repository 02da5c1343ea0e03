"""Recognising a ``mixture.json`` without importing the loader (``stoker inspect`` asks)."""

from __future__ import annotations

import json
import os
from typing import Any

from stoker.manifest import is_url

__all__ = ["MIXTURE_FORMAT", "is_mixture_file"]

MIXTURE_FORMAT = "stoker-mixture/1"


def is_mixture_file(location: Any) -> bool:
    """Whether ``location`` is a local ``.json`` file holding a mixture (not a manifest)."""
    if not isinstance(location, (str, os.PathLike)):
        return False
    path = os.fspath(location)
    if is_url(path) or not path.endswith(".json") or not os.path.isfile(path):
        return False
    try:
        with open(path, "rb") as f:
            doc = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False  # Manifest.load reports what is wrong with the file
    return isinstance(doc, dict) and "sources" in doc and "shards" not in doc
