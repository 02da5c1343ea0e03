"""Path rules for manifests: shard paths stay inside the dataset; URLs lose their secrets."""

from __future__ import annotations

import posixpath
import re
from urllib.parse import urlsplit, urlunsplit

from stoker.manifest.errors import ManifestError

__all__ = ["check_relative_path", "is_url", "join_location", "redact_url"]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_DRIVE = re.compile(r"^[A-Za-z]:")


def is_url(location: str) -> bool:
    """True for ``scheme://...`` locations (``file://`` included)."""
    return bool(_SCHEME.match(location))


def check_relative_path(path: str, field: str) -> str:
    """Return ``path`` if it names a file inside the dataset directory, else raise.

    Shard paths come from a file a stranger may have written, so anything that could
    reach outside the dataset (``..``, absolute paths, URLs, drive letters, backslashes)
    is refused rather than normalised.
    """
    bad = (
        not path
        or path.startswith("/")
        or "\\" in path
        or "\x00" in path
        or _SCHEME.match(path)
        or _DRIVE.match(path)
        or any(part in ("", ".", "..") for part in path.split("/"))
    )
    if bad:
        raise ManifestError(
            f"{field}: path {path!r} escapes or does not name a file inside the dataset directory; "
            "shard paths must be relative POSIX paths without '..', '.', empty segments, "
            "a leading '/', a URL scheme or backslashes. Rewrite the manifest with `stoker shard`.",
            field=field,
        )
    return path


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
