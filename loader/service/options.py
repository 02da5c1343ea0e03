"""``Service``: where a DataLoader gets its batches from in service mode, and how patiently.

``DataLoader(dataset, service=["grpc://a:7000", "grpc://b:7000"])`` takes the URLs as they are;
pass ``Service(urls, timeout=..., token_file=...)`` to set the rest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["SCHEMES", "Service", "service_for"]

SCHEMES = ("grpc://", "grpc+tcp://", "grpc+tls://")


@dataclass(frozen=True, slots=True)
class Service:
    """The servers of a data service and the client's policy.

    Attributes:
        urls: Arrow Flight URLs of ``stoker serve`` processes (``grpc://host:port``).
        timeout: seconds one batch may take, every retry and hedge included; past it the
            loader raises :class:`~stoker.loader.service.errors.ServiceUnavailableError`
            naming every URL tried.
        hedge_quantile: a request slower than this quantile of the recent latencies is also
            sent to the next server; the first answer wins (both are the same bytes).
        hedge_min: never hedge a request younger than this (seconds).
        token: the servers' token (``--token-file``); ``token_file`` reads it from a file.
        transform: the name ``"module:function"`` of a transform the servers run on each batch
            (started with ``--transform``); recorded in the ledger with its version.
        window: keys requested ahead; default ``prefetch_factor x max(1, num_workers)``.
    """

    urls: tuple[str, ...]
    timeout: float = 60.0
    hedge_quantile: float = 0.99
    hedge_min: float = 0.02
    token: str | None = None
    token_file: str | None = None
    transform: str | None = None
    window: int | None = None

    def __post_init__(self) -> None:
        urls = (self.urls,) if isinstance(self.urls, str) else tuple(self.urls)
        object.__setattr__(self, "urls", urls)
        if not urls:
            raise ValueError("service= needs at least one server URL, e.g. "
                             "['grpc://127.0.0.1:7000'] (start one with `stoker serve`).")
        for url in urls:
            if not isinstance(url, str) or not url.startswith(SCHEMES):
                raise ValueError(f"service URL {url!r} must start with one of {SCHEMES}, e.g. "
                                 "'grpc://127.0.0.1:7000'.")
        if len(set(urls)) != len(urls):
            raise ValueError(f"service URLs {list(urls)} list a server twice; list each once.")
        if not self.timeout > 0:
            raise ValueError(f"Service.timeout={self.timeout!r} must be > 0 seconds.")
        if not 0 < self.hedge_quantile <= 1:
            raise ValueError(f"Service.hedge_quantile={self.hedge_quantile!r} must be in (0, 1]"
                             " (1: hedge only past the slowest recent request).")
        if self.hedge_min < 0:
            raise ValueError(f"Service.hedge_min={self.hedge_min!r} must be >= 0 seconds.")
        if self.token is not None and self.token_file is not None:
            raise ValueError("pass Service(token=...) or Service(token_file=...), not both.")
        if self.transform is not None and (not isinstance(self.transform, str)
                                           or ":" not in self.transform):
            raise ValueError(f"Service.transform={self.transform!r} must name 'module:function'"
                             " as the servers were started with (--transform).")
        if self.window is not None and (isinstance(self.window, bool) or self.window < 1):
            raise ValueError(f"Service.window={self.window!r} must be an int >= 1 or None.")

    @classmethod
    def of(cls, value: Any) -> "Service":
        """A ``Service`` from what ``DataLoader(service=...)`` accepts (URLs or a Service)."""
        if isinstance(value, Service):
            return value
        if isinstance(value, str) or isinstance(value, Sequence):
            return cls(tuple(value) if not isinstance(value, str) else (value,))
        raise TypeError(f"service= must be a list of server URLs or a Service, got "
                        f"{type(value).__name__}.")

    def secret(self) -> str | None:
        """The token, read from ``token_file`` when given there (whitespace stripped)."""
        if self.token_file is None:
            return self.token
        with open(os.fspath(self.token_file), encoding="utf-8") as f:
            return f.read().strip()

    def __repr__(self) -> str:  # never show the token
        return (f"Service(urls={list(self.urls)}, timeout={self.timeout}, "
                f"transform={self.transform!r}, token={'***' if self.token else None})")


def service_for(service: Any, dataset: Any) -> Service:
    """The ``Service`` of ``DataLoader(dataset, service=...)``; only a stoker dataset (a path,
    URL or Manifest, not a mixture or a torch dataset) is served."""
    from stoker.loader.read.mixture import is_mixture
    from stoker.manifest import Manifest

    if not isinstance(dataset, (str, os.PathLike, Manifest)) or is_mixture(dataset):
        raise ValueError(f"service= serves a stoker dataset (a path, URL or Manifest); got "
                         f"{type(dataset).__name__}: read mixtures and torch datasets locally.")
    return Service.of(service)
