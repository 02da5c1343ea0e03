"""Typed errors raised by the loader."""

from __future__ import annotations

from stoker.manifest import StokerError

__all__ = ["LoaderError", "LoaderTimeoutError", "StateError", "WorkerError"]


class LoaderError(StokerError):
    """The loader cannot produce the next batch."""


class WorkerError(LoaderError):
    """A worker failed while producing a batch; the message names the batch, shard and samples."""


class LoaderTimeoutError(LoaderError, TimeoutError):
    """No batch arrived within ``timeout`` seconds."""


class StateError(LoaderError, ValueError):
    """A state dict does not fit this loader (other dataset, incompatible options)."""
