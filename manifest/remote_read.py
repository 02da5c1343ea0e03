"""Read a remote manifest's bytes, with errors that say what the server said and what to do.

HTTP(S) is read with the standard library (one GET, ``Connection: close``): the status and URL
are in every error (a 403 is "access refused", never "no manifest found"), and no extra is
needed. Other schemes go through fsspec; a missing backend names the ``pip install
'stoker[...]'`` extra that provides it, and a backend's own error types become a
:class:`ManifestError` naming the (redacted) URL.
"""

from __future__ import annotations

import base64
import http.client
import urllib.error
import urllib.request
from typing import Any, Mapping
from urllib.parse import unquote, urlsplit, urlunsplit

from stoker.manifest.errors import ManifestError

__all__ = ["EXTRAS", "missing_extra", "read_remote"]

EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "http": "http", "https": "http"}
"""URL scheme -> the stoker extra whose packages read it."""

_TIMEOUT_S = 30.0
_HTTP_FIX = {
    401: "the server wants credentials: pass them as storage_options={'headers': "
         "{'Authorization': ...}} (or user:password@ in the URL)",
    403: "the server refused access: check the credentials in storage_options['headers'] "
         "and that the dataset is readable by them",
    404: "there is no manifest.json there: point at the directory `stoker shard` wrote "
         "(it holds manifest.json)",
}


def missing_extra(scheme: str, exc: ImportError, shown: str) -> ManifestError:
    """The error for a backend that is not installed: which extra provides it."""
    extra = EXTRAS.get(scheme.lower())
    fix = f"pip install 'stoker[{extra}]'" if extra else \
        f"install the fsspec backend for {scheme}:// (see fsspec's list of implementations)"
    return ManifestError(f"{shown}: reading {scheme}:// URLs needs a package that is not "
                         f"installed ({exc}). Fix: {fix}.")


def read_remote(location: str, shown: str, storage_options: Mapping[str, Any] | None) -> bytes:
    """The bytes at ``location`` (``shown`` is its redacted form, for messages)."""
    scheme = urlsplit(location).scheme.lower()
    if scheme in ("http", "https"):
        return _read_http(location, shown, dict(storage_options or {}))
    return _read_fsspec(location, shown, scheme, storage_options)


def _read_http(location: str, shown: str, options: dict[str, Any]) -> bytes:
    parts = urlsplit(location)
    headers = {str(k): str(v) for k, v in dict(options.get("headers") or {}).items()}
    headers.setdefault("Connection", "close")
    if parts.username is not None:  # user:password@ -> Basic auth, never sent in the URL
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        headers.setdefault("Authorization", "Basic " + base64.b64encode(pair).decode())
        netloc = parts.hostname or ""
        netloc += f":{parts.port}" if parts.port else ""
        location = urlunsplit(parts._replace(netloc=netloc))
    request = urllib.request.Request(location, headers=headers, method="GET")
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
            return response.read()
    except urllib.error.HTTPError as exc:
        status = exc.code
        exc.close()
        fix = _HTTP_FIX.get(status, "the server failed or is overloaded: retry later, or check "
                            "the server's logs" if status >= 500 else
                            "check the URL and the request headers in storage_options")
        raise ManifestError(f"{shown}: HTTP {status} {exc.reason} when reading the manifest; "
                            f"{fix}.") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ManifestError(f"{shown}: cannot reach the server ({type(exc).__name__}: "
                            f"{reason}); check the URL, the network and that the server runs."
                            ) from None


def _read_fsspec(location: str, shown: str, scheme: str,
                 storage_options: Mapping[str, Any] | None) -> bytes:
    """Through a filesystem of its own, closed afterwards (see :func:`_close_sessions`)."""
    import fsspec  # imported lazily: local datasets never pay for it

    try:
        fs, path = fsspec.core.url_to_fs(location, **{**dict(storage_options or {}),
                                                      "skip_instance_cache": True})
    except ImportError as exc:
        raise missing_extra(scheme, exc, shown) from None
    try:
        with fs.open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise
    except Exception as exc:  # backends raise their own types (botocore, aiohttp, google)
        first = str(exc).splitlines()[0][:300] if str(exc) else ""
        raise ManifestError(f"{shown}: cannot read the manifest ({type(exc).__name__}: "
                            f"{first}); check the URL, the credentials in storage_options "
                            "and the network.") from None
    finally:
        _close_sessions(fs)


def _close_sessions(fs: Any) -> None:
    """Close the client session of an async fsspec filesystem (HTTP/GCS ``_session``, s3fs
    ``_s3``) with the class's own ``close_session``; sync filesystems hold nothing open.

    fsspec keeps every filesystem it builds in a process-wide cache, and an async one keeps
    its client session and that session's keep-alive connections with it: one per thread that
    loaded at the same time, open for the life of the process. A manifest is read once.
    """
    close = getattr(type(fs), "close_session", None)
    for attr in ("_session", "_s3"):
        session = getattr(fs, attr, None)
        if callable(close) and session is not None:
            close(getattr(fs, "loop", None), session)
            setattr(fs, attr, None)
