"""The server's token check: ``--token-file F`` refuses calls without ``Bearer <token>``."""

from __future__ import annotations

import hmac
from typing import Any

import pyarrow.flight as flight

__all__ = ["TokenCheck", "read_token"]


def read_token(path: str) -> str:
    """The token in ``path`` (whitespace stripped); refuses an empty file."""
    with open(path, encoding="utf-8") as f:
        token = f.read().strip()
    if not token:
        raise ValueError(f"--token-file {path}: the file is empty; write a secret token in it.")
    return token


class TokenCheck(flight.ServerMiddlewareFactory):
    """Refuses (UNAUTHENTICATED) every call whose ``authorization`` header is not the token."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def start_call(self, info: Any, headers: dict[str, list[Any]]) -> None:
        given = headers.get("authorization") or headers.get("Authorization") or []
        value = given[0] if given else b""
        value = value.encode() if isinstance(value, str) else bytes(value)
        if not hmac.compare_digest(value, self._expected):
            raise flight.FlightUnauthenticatedError(
                "stoker serve: this server needs a token and the request "
                f"{'has none' if not given else 'has another'}; pass Service(token_file=...) "
                "with the server's --token-file.")
        return None
