"""Locations: join a checked shard path onto a dataset root; URLs lose their secrets.

The rule for the paths themselves lives in :mod:`stoker.manifest.path_rules`.
"""

from __future__ import annotations

import posixpath
import re
from urllib.parse import urlsplit, urlunsplit

__all__ = ["is_url", "join_location", "redact_url"]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(location: str) -> bool:
    """True for ``scheme://...`` locations (``file://`` included)."""
    return bool(_SCHEME.match(location))


def join_location(root: str, relative: str) -> str:
    """Join a checked relative path onto a dataset root (local directory or URL)."""
    if is_url(root):
        parts = urlsplit(root)
        return urlunsplit(parts._replace(path=posixpath.join(parts.path.rstrip("/") + "/", relative)))
    return posixpath.join(root, relative)


def redact_url(location: str) -> str:
    """``location`` without user info, query string or fragment (where credentials hide)."""
    if not is_url(location):
        return location
    parts = urlsplit(location)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
