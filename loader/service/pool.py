"""The loader's "workers" in service mode: a window of batch keys in flight to the servers.

A :class:`ServicePool` has the surface of a :class:`~stoker.loader.workers.pool.WorkerPool`, so
the epoch iterator, its ordering, ledger and state work unchanged: ``submit((gen, step),
(ids, epoch, seed))`` turns the step into a :class:`~stoker.loader.service.key.BatchKey` and
fetches it (stoker.loader.service.client); ``get_any`` hands back the
:class:`~stoker.loader.epoch_iter.Delivered` batch after the user's ``collate_fn`` and
``transform`` ran on it here, as a local worker runs them.

A reply is accepted only if its ids digest equals the digest of the ids this loader computed
and its bytes match its digests; the ledger records the content digests the client computed
(with a server-side transform: the server's digests of the batch before it).
"""

from __future__ import annotations

import threading
import weakref
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, Sequence

from stoker.loader.ledger.digest import batch_digests
from stoker.loader.epoch_iter import BatchTask, Delivered
from stoker.loader.errors import LoaderTimeoutError
from stoker.loader.workers.failure import add_note
from stoker.loader.service.errors import ServiceMismatchError
from stoker.loader.service.key import BatchKey
from stoker.loader.service.wire import ids_digest
from stoker.loader.workers.pool import WorkerPool, batch_name, late

if TYPE_CHECKING:
    from stoker.loader.dataloader import DataLoader

__all__ = ["ServicePool", "check_reply"]


def check_reply(batch: dict[str, Any], facts: dict[str, Any], expected: Any) -> None:
    """Raise :class:`ServiceMismatchError` unless the reply is the batch asked for:
    ``expected`` is ``(ids digest, transform name or None, transform versions seen)``."""
    ids, transform, versions = expected
    if facts.get("ids") != ids:
        raise ServiceMismatchError(f"the server computed other ids for this key (digest "
                                   f"{facts.get('ids')}, the client {ids}): client and server "
                                   "run incompatible stoker versions.")
    columns = facts.get("digest_columns") or []
    got = batch_digests(batch, columns)
    if got != facts.get("digests"):
        raise ServiceMismatchError(f"the bytes received do not match the server's digests "
                                   f"({got} != {facts.get('digests')}): corrupted in transit.")
    sent = facts.get("transform")
    name = None if sent is None else sent.get("name")
    if name != transform:
        raise ServiceMismatchError(f"the server applied transform {name!r}, the loader asked "
                                   f"for {transform!r}.")
    if sent is not None:
        seen = versions.setdefault(name, sent.get("version"))
        if seen != sent.get("version"):
            raise ServiceMismatchError(f"transform {name!r} is version {sent.get('version')!r} "
                                       f"on this server and {seen!r} on another: start every "
                                       "server with the same version.")


class ServicePool(WorkerPool):
    """Keys in flight to the data service, answered in any order, taken by step."""

    def __init__(self, loader: DataLoader, task: BatchTask) -> None:
        source = loader._source
        self._loader = weakref.ref(loader)  # never keep an abandoned loader alive
        self._task = task
        self._transform = source.service.transform
        self.versions: dict[str, Any] = {}
        self._client = source.client(check_reply)
        self._source = source
        self.depth = source.service.window or loader._prefetch * max(1, loader.num_workers)
        self.num_workers = self.depth
        self._keys = ThreadPoolExecutor(max_workers=self.depth,
                                        thread_name_prefix="stoker-service-key")
        self._futures: dict[Any, Future] = {}
        self._lock = threading.Lock()
        self._closed = False

    def _key(self, step: int, epoch: int, seed: int) -> BatchKey:
        loader = self._loader()
        if loader is None:
            raise RuntimeError("the DataLoader of this service pool is gone")
        return BatchKey(dataset=self._source.fingerprint, order=loader.order_options.to_dict(),
                        read=self._source.read, seed=int(seed), epoch=int(epoch),
                        step=int(step), rank=loader.rank, world_size=loader.world_size,
                        batch_size=int(loader.batch_size or 1), drop_last=loader.drop_last,
                        transform=self._transform)

    def submit(self, seq: Any, payload: Any, worker: int | None = None) -> None:
        ids, epoch, seed = payload
        key = self._key(seq[1], epoch, seed)
        fut = self._keys.submit(self._one, key, ids, epoch, seed)
        with self._lock:
            self._futures[seq] = fut

    def _one(self, key: BatchKey, ids: Any, epoch: int, seed: int) -> Delivered:
        expected = (ids_digest(ids), self._transform, self.versions)
        what = f"batch {key.step} of epoch {key.epoch} (rank {key.rank} of {key.world_size})"
        reply = self._client.fetch(key.encode(), key.dataset, self._source.shard_of(ids),
                                   expected, what)
        facts = reply.facts
        content = None
        if self._task.content is not None:
            content = facts.get("content") if facts.get("transform") is not None else \
                batch_digests(reply.batch, self._task.content)
        return Delivered(self._task.finish(reply.batch, ids, epoch, seed), content, {})

    def get_any(self, seqs: Sequence[Any], timeout: float | None = None) -> tuple[Any, Any]:
        with self._lock:
            futures = {self._futures[s]: s for s in seqs if s in self._futures}
        if not futures:
            raise RuntimeError(f"{batch_name(seqs[0])} was never submitted to the service")
        done, _ = wait(list(futures), timeout=timeout, return_when=FIRST_COMPLETED)
        if not done:
            raise LoaderTimeoutError(late(seqs[0], timeout))
        seq = next(futures[f] for f in sorted(done, key=lambda f: seqs.index(futures[f])))
        with self._lock:
            fut = self._futures.pop(seq)
        exc = fut.exception()
        if exc is not None:
            add_note(exc, f"(stoker: {batch_name(seq)}, from the data service)")
            raise exc
        return seq, fut.result()

    def discard_pending(self) -> None:
        with self._lock:
            futures, self._futures = list(self._futures.values()), {}
        for fut in futures:
            fut.cancel()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.discard_pending()
        self._keys.shutdown(wait=False, cancel_futures=True)
