"""HTTP(S) downloads with our own ranged GET, so every rule about ``Range`` is enforceable.

fsspec's HTTP filesystem does not expose the status of a ranged read: a server that ignores
``Range`` (Python's ``http.server`` does) answers ``200`` with the whole body and fsspec
returns it as if it were the range. Here every answer is checked: ``206`` must start exactly
at the resume offset and come from the same object version (ETag, sent as ``If-Range``),
``200`` to a resumed request means "start again from byte 0", and sizes must match the
manifest.
"""

from __future__ import annotations

import base64
import email.utils
import http.client
import ssl
import time
from typing import Any, Mapping
from urllib.parse import unquote, urljoin, urlsplit

from stoker.cache.fetch.download import Fatal, Job, Mismatch, Transient
from stoker.cache.fetch.retry import RetryPolicy

__all__ = ["HttpFetcher"]

_CHUNK = 1 << 20
_FATAL = {400: "bad request", 401: "unauthorised", 403: "access denied", 404: "not found",
          410: "gone"}
_RETRY = {408, 425, 429, 500, 502, 503, 504}
_MAX_REDIRECTS = 5


class HttpFetcher:
    """Downloads ``http://`` and ``https://`` shards.

    Storage options understood: ``headers`` (a mapping sent with every request, e.g.
    ``Authorization``; also accepted under ``client_kwargs``), ``ssl`` (``False`` skips
    certificate checks, for self-signed test servers). ``user:password@`` in a URL becomes
    HTTP Basic authentication. Other keys are ignored.
    """

    def __init__(self, storage_options: Mapping[str, Any] | None, policy: RetryPolicy) -> None:
        opts = dict(storage_options or {})
        headers = dict((opts.get("client_kwargs") or {}).get("headers") or {})
        headers.update(opts.get("headers") or {})
        self._headers = {str(k): str(v) for k, v in headers.items()}
        self._timeout = policy.timeout
        self._ssl = ssl.create_default_context()
        if opts.get("ssl") is False:
            self._ssl.check_hostname = False
            self._ssl.verify_mode = ssl.CERT_NONE

    def attempt(self, job: Job) -> None:
        url = job.url
        for _ in range(_MAX_REDIRECTS + 1):
            parts = urlsplit(url)
            if parts.scheme == "https":
                conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                    parts.hostname or "", parts.port, timeout=self._timeout, context=self._ssl)
            else:
                conn = http.client.HTTPConnection(parts.hostname or "", parts.port,
                                                  timeout=self._timeout)
            try:
                conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
                             headers=self._request_headers(job, parts, same_host=url == job.url))
                resp = conn.getresponse()
                location = resp.getheader("Location")
                if resp.status in (301, 302, 303, 307, 308) and location:
                    url = urljoin(url, location)
                    continue
                _receive(job, resp)
                return
            except (http.client.HTTPException, OSError) as exc:
                raise Transient(f"network error {type(exc).__name__}") from None
            finally:
                conn.close()
        raise Fatal(f"more than {_MAX_REDIRECTS} redirects")

    def _request_headers(self, job: Job, parts: Any, same_host: bool) -> dict[str, str]:
        headers = {"User-Agent": "stoker-cache", "Accept-Encoding": "identity"}
        if same_host:  # credentials never follow a redirect to another host
            headers.update(self._headers)
            if parts.username is not None:
                raw = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
                headers["Authorization"] = "Basic " + base64.b64encode(raw).decode("ascii")
        if job.offset:
            headers["Range"] = f"bytes={job.offset}-"
            if job.etag and not job.etag.startswith("W/"):
                headers["If-Range"] = job.etag  # a changed object answers 200, not a splice
        return headers


def _receive(job: Job, resp: http.client.HTTPResponse) -> None:
    status = resp.status
    etag = resp.getheader("ETag")
    if status == 200:
        if job.offset:
            job.restart("server answered a Range request with the whole object (200)")
        total = _int_header(resp, "Content-Length")
    elif status == 206:
        start, total = _content_range(resp.getheader("Content-Range"))
        if start != job.offset:
            job.restart(f"server sent bytes from {start}, asked for {job.offset}")
            raise Transient("Content-Range did not match the request", status=206)
        if job.etag and etag and etag != job.etag:
            job.restart("object changed mid-download (ETag)")
            raise Transient("object changed mid-download", status=206)
    elif status == 416:
        job.restart("server refused the resume range (416)")
        raise Transient("range not satisfiable", status=416)
    elif status in _RETRY:
        raise Transient(f"HTTP {status}", status=status,
                        retry_after=_retry_after(resp.getheader("Retry-After")))
    else:
        raise Fatal(f"HTTP {status} ({_FATAL.get(status, 'unexpected status')})", status=status)
    if total is not None and total != job.size:
        raise Mismatch(f"the server's object has {total} bytes, the manifest says {job.size}")
    if job.offset == 0 or job.etag is None:
        job.etag = etag
    while job.offset < job.size:
        chunk = resp.read1(min(_CHUNK, job.size - job.offset))  # returns what has arrived
        if not chunk:
            raise Transient(f"connection closed after byte {job.offset} of {job.size}",
                            status=status)
        job.write(chunk)
    if total is None and resp.read(1):
        raise Mismatch(f"the server's object is longer than the manifest's {job.size} bytes")


def _int_header(resp: http.client.HTTPResponse, name: str) -> int | None:
    value = resp.getheader(name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _content_range(value: str | None) -> tuple[int, int | None]:
    """``bytes START-END/TOTAL`` -> (START, TOTAL or None when ``*``)."""
    try:
        unit, _, spec = (value or "").partition(" ")
        span, _, total = spec.partition("/")
        if unit.strip().lower() != "bytes":
            raise ValueError(value)
        return int(span.split("-")[0]), (None if total.strip() == "*" else int(total))
    except ValueError:
        raise Transient(f"unparseable Content-Range {value!r}", status=206) from None


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
