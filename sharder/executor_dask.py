"""Dask distributed as a sharding engine: the same "map tasks, gather small results" interface.

Every task writes its own files under DST and returns a small dict, so a cluster only needs
DST on a filesystem that every worker and this process see (NFS, Lustre, a FUSE mount). The
plan is decided before any task runs, so the bytes do not depend on the engine, the number of
workers or the order in which tasks finish.

Dask is an optional extra (``pip install 'stoker[dask]'``); it is imported only here, when a
:class:`DaskExecutor` is created.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Iterator, TypeVar

from stoker.sharder.errors import ShardOptionsError, SharderError

__all__ = ["DaskExecutor", "import_distributed"]

T = TypeVar("T")
R = TypeVar("R")
_log = logging.getLogger(__name__)


def import_distributed() -> Any:
    """The ``distributed`` module, or a clear error naming the extra to install."""
    try:
        import distributed
    except ImportError as exc:
        raise SharderError(
            "the Dask engine needs the optional packages dask and distributed, which are not "
            f"installed ({exc}); install them with `pip install 'stoker[dask]'` or use "
            "--engine local.") from exc
    return distributed


class DaskExecutor:
    """Run tasks on a Dask cluster: an existing scheduler, or an in-process ``LocalCluster``.

    Args:
        scheduler: address of a running scheduler (``tcp://HOST:PORT``). ``None`` starts a
            ``LocalCluster`` of ``workers`` single-threaded processes on this machine, every
            port (dashboard/HTTP included) on 127.0.0.1 only, closed when the map finishes.
        workers: processes of the local cluster (default 1). With ``scheduler``: how many
            tasks run at once (default: the workers connected now), which sets how many groups
            the shards of one streamed file (CSV, JSONL, tar) are split into.

    A failing task cancels the tasks not yet finished and re-raises its exception here.
    """

    def __init__(self, scheduler: str | None = None, workers: int | None = None) -> None:
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                    or workers < 1):
            raise ShardOptionsError(f"workers={workers!r} must be a positive integer, e.g. 4.")
        if scheduler is not None and (not isinstance(scheduler, str) or "://" not in scheduler):
            raise ShardOptionsError(f"scheduler={scheduler!r} is not a scheduler address; give "
                                    "one like tcp://10.0.0.5:8786, or leave it out to start a "
                                    "local cluster.")
        distributed = import_distributed()
        self.scheduler = scheduler
        if workers is None and scheduler is not None:
            with self._client(distributed) as client:
                workers = sum(client.nthreads().values())
        self.workers = max(1, workers or 1)

    def map(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[R]:
        tasks = list(tasks)
        if not tasks:
            return
        distributed = import_distributed()
        with self._client(distributed) as client:
            # pure=False: identical tasks still run (each writes its own files).
            futures = client.map(fn, tasks, pure=False)
            try:
                for future in distributed.as_completed(futures):
                    yield future.result()
            finally:
                client.cancel(futures)

    def _client(self, distributed: Any) -> Any:
        if self.scheduler is not None:
            try:
                return distributed.Client(self.scheduler, timeout="30s")
            except (OSError, TimeoutError) as exc:
                raise SharderError(f"cannot reach the Dask scheduler at {self.scheduler!r} "
                                   f"({type(exc).__name__}: {exc}); check that it runs and the "
                                   "address, or leave --scheduler out for a local cluster."
                                   ) from exc
        return _LocalClient(distributed, self.workers)


class _LocalClient:
    """A ``LocalCluster`` + ``Client`` pair, closed together (a context manager)."""

    def __init__(self, distributed: Any, workers: int) -> None:
        self._cluster = distributed.LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True,
            # a random loopback port: the scheduler's HTTP server otherwise takes :8787
            dashboard_address="127.0.0.1:0", host="127.0.0.1", silence_logs=logging.WARNING)
        self._client = distributed.Client(self._cluster)

    def __enter__(self) -> Any:
        return self._client

    def __exit__(self, *exc: object) -> None:
        self._client.close()
        self._cluster.close()
