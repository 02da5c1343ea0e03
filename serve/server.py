"""The Arrow Flight server of ``stoker serve``: ``do_get(key)`` -> one batch, ``status``.

``do_get``: the ticket is a ``stoker.batch-key/1`` key (stoker.loader.service.key); the reply
is one ``stoker.batch/1`` record batch (stoker.loader.service.wire). A key the server cannot
answer (malformed, an unknown fingerprint, a transform it does not run, options that do not
fit the dataset) is refused with a Flight error whose message says what was wrong; the server
keeps serving every other request. ``do_action("status")`` returns health and counters as
JSON. :meth:`BatchServer.stop` (SIGTERM, see stoker.serve.run) lets in-flight requests finish.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from stoker.loader.service.key import BatchKey
from stoker.loader.service.wire import encode_batch
from stoker.manifest import StokerError, stoker_version
from stoker.serve.auth import TokenCheck
from stoker.serve.catalog import Catalog

__all__ = ["BatchServer", "STATUS_FORMAT"]

STATUS_FORMAT = "stoker.serve-status/1"
logger = logging.getLogger("stoker.serve")


class _Counters:
    """Requests, batches, bytes, refusals, failures and handler latencies (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = self.batches = self.bytes = self.refused = self.failed = 0
        self.in_flight = 0
        self.latency: list[float] = []
        self.last_refusal = ""

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            lat = np.array(self.latency[-4096:]) if self.latency else np.zeros(1)
            return {"requests": self.requests, "batches": self.batches, "bytes": self.bytes,
                    "refused": self.refused, "failed": self.failed, "in_flight": self.in_flight,
                    "last_refusal": self.last_refusal,
                    "latency_ms": {"p50": round(float(np.quantile(lat, 0.5)) * 1e3, 3),
                                   "p99": round(float(np.quantile(lat, 0.99)) * 1e3, 3)}}


class BatchServer(flight.FlightServerBase):
    """Serves the batches of ``catalog`` at ``location`` (``grpc://host:port``; port 0 picks
    a free one, see :attr:`url`); with ``token``, only to clients that send it."""

    def __init__(self, catalog: Catalog, location: str, token: str | None = None) -> None:
        middleware = {"token": TokenCheck(token)} if token else None
        super().__init__(location, middleware=middleware)
        self.catalog = catalog
        host = location.split("://", 1)[1].rsplit(":", 1)[0]
        self.url = f"grpc://{host}:{self.port}"
        self.counters = _Counters()
        self.started = time.time()
        self.stopping = False

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.RecordBatchStream:
        c = self.counters
        t0 = time.perf_counter()
        with c.lock:
            c.requests += 1
            c.in_flight += 1
        try:
            try:
                key = BatchKey.decode(ticket.ticket)
                batch, facts = self.catalog.batch(key)
                record = encode_batch(batch, facts)
            except StokerError as exc:
                with c.lock:
                    c.refused += 1
                    c.last_refusal = str(exc)[:300]
                raise flight.FlightServerError(f"stoker serve refused the key: {exc}") from None
            except Exception as exc:  # a failure here must not stop the server: named, counted
                with c.lock:
                    c.failed += 1
                logger.exception("stoker serve: a batch failed")
                raise flight.FlightServerError(f"stoker serve failed on this key: "
                                               f"{type(exc).__name__}: {exc}") from None
            with c.lock:
                c.batches += 1
                c.bytes += record.nbytes
                c.latency.append(time.perf_counter() - t0)
                if len(c.latency) > 8192:
                    del c.latency[:4096]
            return flight.RecordBatchStream(pa.RecordBatchReader.from_batches(record.schema,
                                                                              [record]))
        finally:
            with c.lock:
                c.in_flight -= 1

    def status(self) -> dict[str, Any]:
        return {"format": STATUS_FORMAT, "url": self.url, "pid": os.getpid(),
                "healthy": not self.stopping, "stoker": stoker_version(),
                "uptime_s": round(time.time() - self.started, 3),
                "datasets": self.catalog.describe(),
                "transforms": [t.describe() for t in self.catalog.transforms.values()],
                **self.counters.snapshot()}

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return [("status", "health and counters of this server as JSON")]

    def do_action(self, context: Any, action: flight.Action) -> Iterator[bytes]:
        if action.type != "status":
            raise flight.FlightServerError(f"stoker serve has no action {action.type!r}; "
                                           "the actions are ['status'].")
        yield json.dumps(self.status()).encode()

    def stop(self) -> None:
        """Stop accepting requests, let the ones in flight finish, release the datasets."""
        self.stopping = True
        self.shutdown()
        self.catalog.close()
