"""Typed errors of the data service's client (``DataLoader(..., workers=WorkerOptions(service=[...]))``)."""

from __future__ import annotations

from typing import Mapping

from stoker.loader.errors import LoaderError

__all__ = ["ServiceError", "ServiceMismatchError", "ServiceRefusedError",
           "ServiceUnavailableError"]


class ServiceError(LoaderError, RuntimeError):
    """The data service could not deliver a batch."""


class ServiceUnavailableError(ServiceError, ConnectionError):
    """No server answered a batch within the service's ``timeout``; the message names every
    URL tried and what each did (refused the connection, timed out, failed)."""

    def __init__(self, what: str, tried: Mapping[str, str], timeout: float) -> None:
        self.tried = dict(tried)
        lines = "; ".join(f"{url}: {why}" for url, why in tried.items())
        super().__init__(f"no stoker server delivered {what} within timeout={timeout:g} s; "
                         f"tried {len(tried)} URL(s): {lines}. Start the servers "
                         "(`stoker serve DATASET --port P`) or pass their URLs in WorkerOptions(service=...).")


class ServiceRefusedError(ServiceError, ValueError):
    """Every server refused the request itself (a wrong token, a dataset it does not serve,
    a key it cannot read): retrying cannot help; the message names each URL and its reason."""

    def __init__(self, what: str, tried: Mapping[str, str]) -> None:
        self.tried = dict(tried)
        lines = "; ".join(f"{url}: {why}" for url, why in tried.items())
        super().__init__(f"every stoker server refused {what}: {lines}")


class ServiceMismatchError(ServiceError):
    """A server's answer is not the batch asked for: other ids than the client computes
    (another stoker version), bytes that do not match their digests, or a transform of
    another version than the ledger records."""
