"""stoker.loader: the order contract, workers, resume, and the drop-in DataLoader."""

from stoker.loader.dataloader import DataLoader
from stoker.loader.errors import LoaderError, LoaderTimeoutError, StateError, WorkerError

__all__ = ["DataLoader", "LoaderError", "LoaderTimeoutError", "StateError", "WorkerError"]
