"""A small HTTP file server that misbehaves on purpose, one planned fault per request.

It speaks HTTP/1.0 (one request per connection), serves byte ranges with ``206``,
``Content-Range``, strong ``ETag`` and ``If-Range`` like a real object store, and logs every
request it answered, so tests assert on what really crossed the wire. Faults are queued per
path with :meth:`FaultServer.plan` and consumed one per request; without a fault the server
behaves correctly.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import xxhash

__all__ = ["Fault", "FaultServer", "Request"]


@dataclass(frozen=True)
class Fault:
    """What to do wrong on one request (build with the class methods)."""

    kind: str
    after: int = 0
    status: int = 0
    retry_after: str | None = None
    seconds: float = 0.0
    new: bytes | None = None

    @classmethod
    def status_code(cls, status: int, retry_after: str | int | None = None) -> "Fault":
        """Answer ``status`` (e.g. 503, 429, 403) with an optional ``Retry-After``."""
        return cls("status", status=status,
                   retry_after=None if retry_after is None else str(retry_after))

    @classmethod
    def reset(cls, after: int) -> "Fault":
        """Send ``after`` body bytes, then reset the connection (RST)."""
        return cls("reset", after=after)

    @classmethod
    def stall(cls, after: int, seconds: float) -> "Fault":
        """Send ``after`` body bytes, then go silent for ``seconds`` and close."""
        return cls("stall", after=after, seconds=seconds)

    @classmethod
    def truncate(cls, after: int) -> "Fault":
        """Promise the full length, send ``after`` body bytes, close cleanly (FIN)."""
        return cls("truncate", after=after)

    @classmethod
    def ignore_range(cls) -> "Fault":
        """Answer a ranged request with 200 and the whole object (like ``http.server``)."""
        return cls("ignore_range")

    @classmethod
    def change(cls, after: int, new: bytes) -> "Fault":
        """Send ``after`` bytes, replace the object with ``new`` (new ETag), reset."""
        return cls("change", after=after, new=new)

    @classmethod
    def corrupt(cls) -> "Fault":
        """Serve the object with one byte flipped in the middle (same size, same ETag)."""
        return cls("corrupt")


@dataclass(frozen=True)
class Request:
    path: str
    range: str | None
    if_range: str | None
    status: int
    sent: int
    headers: tuple[tuple[str, str], ...]


def etag_of(data: bytes) -> str:
    return f'"{xxhash.xxh3_64_hexdigest(data)}"'


class FaultServer:
    """Serve in-memory objects on 127.0.0.1 with injectable faults; ``url`` is the base URL.

    Args:
        honour_if_range: answer a stale ``If-Range`` with 200 (as RFC 9110 says); when False,
            ignore ``If-Range`` and send 206 from the new object (a lazy server).
    """

    def __init__(self, honour_if_range: bool = True) -> None:
        self.honour_if_range = honour_if_range
        self._objects: dict[str, tuple[bytes, str]] = {}
        self._plans: dict[str, list[Fault]] = {}
        self._log: list[Request] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.owner = self  # type: ignore[attr-defined]
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()

    def put(self, path: str, data: bytes) -> None:
        with self._lock:
            self._objects["/" + path.lstrip("/")] = (bytes(data), etag_of(data))

    def put_dir(self, local: str | os.PathLike[str], prefix: str = "") -> None:
        """Serve every file under ``local`` at ``/prefix/<relative path>``."""
        root = os.fspath(local)
        for dirpath, _, files in os.walk(root):
            for name in files:
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                with open(path, "rb") as f:
                    self.put(f"{prefix.strip('/')}/{rel}" if prefix else rel, f.read())

    def get(self, path: str) -> bytes:
        return self._objects["/" + path.lstrip("/")][0]

    def plan(self, path: str, *faults: Fault) -> None:
        """Queue ``faults`` for the next requests of ``path`` (one each, in order)."""
        with self._lock:
            self._plans.setdefault("/" + path.lstrip("/"), []).extend(faults)

    def requests(self, path: str | None = None) -> list[Request]:
        with self._lock:
            log = list(self._log)
        return log if path is None else [r for r in log if r.path == "/" + path.lstrip("/")]

    def _next_fault(self, path: str) -> Fault | None:
        with self._lock:
            plan = self._plans.get(path)
            return plan.pop(0) if plan else None

    def _record(self, request: Request) -> None:
        with self._lock:
            self._log.append(request)

    def close(self) -> None:
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def __enter__(self) -> "FaultServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass  # the server keeps its own structured log

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        owner: FaultServer = self.server.owner  # type: ignore[attr-defined]
        path = urlsplit(self.path).path
        rng, if_range = self.headers.get("Range"), self.headers.get("If-Range")
        fault = owner._next_fault(path)
        headers = tuple((k, v) for k, v in self.headers.items())
        with owner._lock:
            obj = owner._objects.get(path)
        if fault is not None and fault.kind == "status":
            self._answer_status(owner, path, rng, if_range, fault.status, fault.retry_after, headers)
            return
        if obj is None:
            self._answer_status(owner, path, rng, if_range, 404, None, headers)
            return
        data, etag = obj
        start, partial = 0, False
        if rng and not (fault is not None and fault.kind == "ignore_range"):
            stale = if_range is not None and owner.honour_if_range and if_range != etag
            if not stale:
                start = int(rng.removeprefix("bytes=").split("-")[0])
                if start >= len(data):
                    self._answer_status(owner, path, rng, if_range, 416, None, headers)
                    return
                partial = True
        body = data[start:]
        if fault is not None and fault.kind == "corrupt":
            mid = len(data) // 2 - start
            if 0 <= mid < len(body):
                body = body[:mid] + bytes([body[mid] ^ 0xFF]) + body[mid + 1:]
        status = 206 if partial else 200
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", etag)
        self.send_header("Accept-Ranges", "bytes")
        if partial:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        cut = fault is not None and fault.kind in ("reset", "stall", "truncate", "change")
        sent = min(fault.after, len(body)) if cut and fault is not None else len(body)
        # Logged before the body goes out: the client may act on the answer at once.
        owner._record(Request(path, rng, if_range, status, sent, headers))
        self.end_headers()
        self._send_body(owner, path, body, fault)

    def _send_body(self, owner: FaultServer, path: str, body: bytes, fault: Fault | None) -> None:
        kind = fault.kind if fault is not None else "none"
        if kind not in ("reset", "stall", "truncate", "change"):
            self._write(body)
            return
        after = fault.after if fault is not None else 0
        self._write(body[:after])
        if fault is not None and kind == "stall":
            owner._stopping.wait(fault.seconds)
        if fault is not None and kind == "change" and fault.new is not None:
            owner.put(path, fault.new)
        self.close_connection = True
        # Let the client drain what was sent: Linux discards unread data on receiving a RST.
        owner._stopping.wait(0.1)
        if kind in ("reset", "change"):  # linger 0: close() sends RST instead of FIN
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.connection.close()

    def _write(self, data: bytes) -> None:
        try:
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            pass  # the client went away; the log still says what was attempted

    def _answer_status(self, owner: FaultServer, path: str, rng: str | None, if_range: str | None,
                       status: int, retry_after: str | None,
                       headers: tuple[tuple[str, str], ...]) -> None:
        body = f"status {status}\n".encode()
        self.send_response(status)
        if retry_after is not None:
            self.send_header("Retry-After", retry_after)
        self.send_header("Content-Length", str(len(body)))
        owner._record(Request(path, rng, if_range, status, 0, headers))
        self.end_headers()
        self._write(body)
