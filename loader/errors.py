"""Typed errors raised by the loader.

Where torch's DataLoader raises a ``RuntimeError`` (a timeout, a worker that died), stoker's
error is a ``RuntimeError`` too, so code written for torch catches it; an exception raised by
the user's dataset is re-raised as its own type (see ``stoker.loader.workers.failure``).
"""

from __future__ import annotations

from stoker.manifest import StokerError

__all__ = ["LoaderError", "LoaderTimeoutError", "OptionsError", "StateError", "WorkerError"]


class LoaderError(StokerError):
    """The loader cannot produce the next batch."""


class WorkerError(LoaderError, RuntimeError):
    """A worker failed or died while producing a batch; the message names the batch and the
    worker (pid and signal for a process that died), or the shard and samples for a read."""


class LoaderTimeoutError(LoaderError, RuntimeError, TimeoutError):
    """No batch arrived within ``timeout`` seconds (a ``RuntimeError``, as torch raises)."""


class StateError(LoaderError, ValueError):
    """A state dict does not fit this loader (other dataset, incompatible options)."""


class OptionsError(LoaderError, ValueError):
    """An option of the DataLoader or of one of its option objects is invalid; the message
    names the option, the value received and what would be accepted."""
