"""The data service's client: one batch key -> one verified batch, whatever servers fail.

Routing: the servers are ranked for a key by rendezvous (highest-random-weight) hashing of
``(url, dataset, affinity)`` where the affinity is the shard of the batch's first sample, so
a shard's batches go to the same server (its cache stays warm) and, when a server leaves, only
its keys move. Servers that failed recently (down for a cool-down) or have a request
outstanding longer than the hedge threshold (stalled) go to the end of the ranking.

Failover is a retry of the same key on the next server of the ranking; a request slower than
the hedge threshold (a quantile of the recent latencies) is also sent to the next server and
the first verified answer wins. A key is the batch, so every answer is the same bytes: each
reply is checked against its digests and the ids the client computed before it is accepted,
and a hedged pair's digests are compared. When no server delivers within the timeout, the
error names every URL tried and what each did.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pyarrow.flight as flight
import xxhash

from stoker.loader.service.errors import (ServiceMismatchError, ServiceRefusedError,
                                          ServiceUnavailableError)
from stoker.loader.service.options import Service
from stoker.loader.service.wire import decode_batch
from stoker.manifest import StokerError

__all__ = ["ClientStats", "Reply", "ServiceClient", "rendezvous"]

logger = logging.getLogger("stoker.loader")

_RETRYABLE = (flight.FlightUnavailableError, flight.FlightTimedOutError,
              flight.FlightInternalError, flight.FlightCancelledError, ConnectionError, OSError)
_COOLDOWN = (0.25, 5.0)  # seconds a failed server is ranked last: first, at most
_MIN_SAMPLES = 16  # latencies before the quantile is trusted (until then: timeout / 4)


@dataclass
class Reply:
    """A verified answer: the batch, the reply's facts, which server sent it."""

    batch: dict[str, Any]
    facts: dict[str, Any]
    url: str


@dataclass
class ClientStats:
    """What the client did: replies per server, failovers, hedges (and hedges won)."""

    replies: dict[str, int] = field(default_factory=dict)
    failovers: int = 0
    hedges: int = 0
    hedges_won: int = 0
    mismatches: int = 0


def rendezvous(urls: "tuple[str, ...] | list[str]", dataset: str, affinity: int) -> list[str]:
    """``urls`` ranked for a key by rendezvous hashing of ``(url, dataset, affinity)``, best
    first: a pure function, so every client ranks alike and removing a server moves only the
    keys it ranked first."""
    def score(url: str) -> int:
        return xxhash.xxh3_64_intdigest(f"{url}|{dataset}|{affinity}".encode())

    return sorted(urls, key=score, reverse=True)


class _Refused(StokerError):
    """A server refused the request itself (not a transport failure)."""


class ServiceClient:
    """Fetch batch keys from the servers of ``service`` (thread-safe)."""

    def __init__(self, service: Service,
                 check: Callable[[dict[str, Any], dict[str, Any], Any], None] | None) -> None:
        self.service = service
        self.check = check  # (batch, facts, expected) -> None or raises ServiceMismatchError
        token = service.secret()
        headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
        self._headers = headers
        self._clients: dict[str, flight.FlightClient] = {}
        self._lock = threading.Lock()
        self._latency: deque[float] = deque(maxlen=512)
        self._threshold: float | None = None
        self._fresh = 0  # latencies since the threshold was computed
        self._down: dict[str, tuple[float, float]] = {}  # url -> (until, cool-down)
        self._started: dict[int, tuple[str, float]] = {}  # attempt id -> (url, start)
        self._attempts = ThreadPoolExecutor(max_workers=64, thread_name_prefix="stoker-service")
        self.stats = ClientStats()
        self._closed = False

    # -- ranking ---------------------------------------------------------------------------
    def ranking(self, dataset: str, affinity: int) -> list[str]:
        """Servers for a key, best first: healthy ones by rendezvous score, then the rest."""
        ranked = rendezvous(self.service.urls, dataset, affinity)
        now = time.monotonic()
        with self._lock:
            slow = {u for u, t0 in self._started.values() if now - t0 > self._hedge_after()}
            bad = {u for u, (until, _) in self._down.items() if until > now} | slow
        return [u for u in ranked if u not in bad] + [u for u in ranked if u in bad]

    def _hedge_after(self) -> float:
        """Seconds after which a request is hedged (call with the lock held); the quantile
        is recomputed every 16 latencies (a sort per key would cost more than the check)."""
        if len(self._latency) < _MIN_SAMPLES:
            return max(self.service.hedge_min, self.service.timeout / 4)
        if self._threshold is None or self._fresh >= _MIN_SAMPLES:
            q = np.quantile(np.fromiter(self._latency, float), self.service.hedge_quantile)
            self._threshold, self._fresh = max(self.service.hedge_min, float(q)), 0
        return self._threshold

    # -- one key ---------------------------------------------------------------------------
    def fetch(self, key: bytes, dataset: str, affinity: int, expected: Any, what: str) -> Reply:
        """The verified batch of ``key``; ``expected`` goes to the check; ``what`` names the
        batch in errors."""
        timeout = self.service.timeout
        deadline = time.monotonic() + timeout
        tried: dict[str, str] = {}
        pending: dict[Future, str] = {}
        queue = self.ranking(dataset, affinity)
        while True:
            now = time.monotonic()
            if now >= deadline:
                for url in pending.values():
                    tried[url] = f"no answer within {timeout:g} s"
                raise ServiceUnavailableError(what, tried, timeout)
            if not pending:
                if not queue:  # every server failed once: refused everywhere, or wait a little
                    if tried and all(why.startswith("refused") for why in tried.values()):
                        raise ServiceRefusedError(what, tried)
                    time.sleep(min(0.05, max(0.0, deadline - now)))
                    queue = self.ranking(dataset, affinity)
                    continue
                url = queue.pop(0)
                pending[self._launch(url, key, deadline, expected)] = url
            with self._lock:
                hedge = self._hedge_after()
            done, _ = wait(list(pending), timeout=min(hedge, max(0.0, deadline - now)),
                           return_when=FIRST_COMPLETED)
            if not done:
                if queue and len(pending) < 2:  # a straggler: ask the next server too
                    with self._lock:
                        self.stats.hedges += 1
                    url = queue.pop(0)
                    pending[self._launch(url, key, deadline, expected)] = url
                continue
            winner = None
            for fut in done:
                url = pending.pop(fut)
                try:
                    reply = fut.result()
                except _Refused as exc:
                    tried[url] = f"refused: {exc}"
                except ServiceMismatchError as exc:
                    tried[url] = f"wrong answer: {exc}"
                    self._mark_down(url)
                except _RETRYABLE as exc:
                    tried[url] = _reason(exc)
                    self._mark_down(url)
                    with self._lock:
                        self.stats.failovers += 1
                else:
                    winner = winner or reply
            if winner is not None:
                self._settle(winner, pending)
                return winner

    def _settle(self, winner: Reply, pending: dict[Future, str]) -> None:
        with self._lock:
            self.stats.replies[winner.url] = self.stats.replies.get(winner.url, 0) + 1
            if pending:
                self.stats.hedges_won += 1
        for fut in pending:  # the loser, if it ever answers, must have sent the same bytes
            fut.add_done_callback(lambda f, w=winner: self._compare(f, w))

    def _compare(self, fut: Future, winner: Reply) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return
        other = fut.result()
        if other.facts.get("digests") != winner.facts.get("digests"):
            with self._lock:
                self.stats.mismatches += 1
            logger.error("stoker service: %s and %s sent different bytes for one key "
                         "(digests %s vs %s): the servers are not deterministic alike",
                         winner.url, other.url, winner.facts.get("digests"),
                         other.facts.get("digests"))

    # -- one attempt -----------------------------------------------------------------------
    def _launch(self, url: str, key: bytes, deadline: float, expected: Any) -> Future:
        return self._attempts.submit(self._attempt, url, key, deadline, expected)

    def _attempt(self, url: str, key: bytes, deadline: float, expected: Any) -> Reply:
        token = threading.get_ident()
        t0 = time.monotonic()
        with self._lock:
            self._started[token] = (url, t0)
        try:
            options = flight.FlightCallOptions(timeout=max(0.001, deadline - t0),
                                               headers=self._headers)
            try:
                reader = self._client(url).do_get(flight.Ticket(key), options)
                record = reader.read_chunk().data
            except flight.FlightUnauthenticatedError as exc:
                raise _Refused(_clean(exc)) from None
            except flight.FlightServerError as exc:  # the server's own typed refusal
                raise _Refused(_clean(exc)) from None
            batch, facts = decode_batch(record)
            if self.check is not None:
                self.check(batch, facts, expected)
        finally:
            with self._lock:
                self._started.pop(token, None)
        with self._lock:
            self._latency.append(time.monotonic() - t0)
            self._fresh += 1
            self._down.pop(url, None)
        return Reply(batch, facts, url)

    def status(self, url: str) -> dict[str, Any] | None:
        """The ``status`` action of ``url`` as a dict; ``None`` when it does not answer."""
        import json

        options = flight.FlightCallOptions(timeout=min(10.0, self.service.timeout),
                                           headers=self._headers)
        try:
            results = list(self._client(url).do_action(flight.Action("status", b""), options))
        except flight.FlightError as exc:
            logger.warning("stoker service: no status from %s: %s", url, _clean(exc))
            return None
        return json.loads(results[0].body.to_pybytes())

    def _client(self, url: str) -> flight.FlightClient:
        with self._lock:
            client = self._clients.get(url)
            if client is None:
                client = self._clients[url] = flight.FlightClient(url)
            return client

    def _mark_down(self, url: str) -> None:
        with self._lock:
            _, last = self._down.get(url, (0.0, _COOLDOWN[0] / 2))
            cool = min(_COOLDOWN[1], last * 2)
            self._down[url] = (time.monotonic() + cool, cool)

    def close(self) -> None:
        """Stop the attempt threads (outstanding ones end at their deadline); idempotent."""
        if self._closed:
            return
        self._closed = True
        self._attempts.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()


def _clean(exc: BaseException) -> str:
    """A Flight error's message without gRPC's debug context."""
    return str(exc).split(". Detail:")[0].split(". gRPC client debug context")[0]


def _reason(exc: BaseException) -> str:
    if isinstance(exc, flight.FlightTimedOutError):
        return "timed out"
    if isinstance(exc, flight.FlightUnavailableError):
        text = str(exc)
        return "connection refused" if "refused" in text.lower() else f"unavailable ({_clean(exc)})"
    return f"{type(exc).__name__}: {_clean(exc)}"
