"""Keep credentials out of messages: collect secret values, scrub them from any text."""

from __future__ import annotations

import re
from typing import Any, Mapping

__all__ = ["Scrubber"]

_SECRET_KEYS = ("key", "secret", "token", "pass", "auth", "credential", "session", "sig",
                "cookie", "private")
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]*@")
_QUERY = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s?#'\"]*)[?#][^\s'\"]*")


class Scrubber:
    """Removes the secrets of one set of storage options (and of URLs) from text.

    Every string value under a key that looks like a credential (``key``, ``secret``,
    ``token``, ``password``, ``Authorization`` ...), at any depth of the options, is replaced
    by ``***``; so are URL user-info and query strings (pre-signed URLs carry signatures there).
    """

    __slots__ = ("_secrets",)

    def __init__(self, storage_options: Mapping[str, Any] | None = None,
                 extra: tuple[str, ...] = ()) -> None:
        found: set[str] = {s for s in extra if s}
        _collect(storage_options or {}, False, found)
        # Longest first, so a secret containing another is replaced whole.
        self._secrets = tuple(sorted((s for s in found if len(s) >= 4), key=len, reverse=True))

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        text = _USERINFO.sub(r"\1***@", text)
        return _QUERY.sub(r"\1?***", text)


def _collect(value: Any, secret: bool, out: set[str]) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _collect(v, secret or any(word in str(k).lower() for word in _SECRET_KEYS), out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _collect(v, secret, out)
    elif isinstance(value, str) and secret:
        out.add(value)
        if value.lower().startswith(("basic ", "bearer ", "token ")):
            out.add(value.split(" ", 1)[1])
