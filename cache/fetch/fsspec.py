"""Downloads through fsspec (``s3://``, ``gs://``, ...) and plain local copies.

S3 (s3fs) gets its own checked ranged GETs (:func:`_read_s3`). Other protocols read through
``fs.open(..., cache_type="none")`` in fixed chunks from the resume offset, so an interrupted
download continues where it stopped; a new ETag on a later attempt restarts from zero.
fsspec does not report whether a ranged read was honoured, so a chunk longer than asked for
(a server ignoring ``Range``) throws the partial file away and takes the whole object in one
read instead of splicing it.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
from typing import Any, Mapping

from stoker.cache.errors import CacheError
from stoker.cache.fetch.download import Fatal, Job, Mismatch, Transient
from stoker.manifest.remote_read import missing_extra

__all__ = ["FsspecFetcher", "LocalFetcher"]

_CHUNK = 32 << 20  # per ranged GET: fewer requests (cost, latency); memory per download


class FsspecFetcher:
    """Any fsspec protocol; ``storage_options`` go to the filesystem unchanged."""

    def __init__(self, storage_options: Mapping[str, Any] | None) -> None:
        self._options = dict(storage_options or {})
        self._lock = threading.Lock()
        self._fs: tuple[int, str, Any] | None = None  # (pid, protocol, filesystem)

    def _filesystem(self, url: str) -> tuple[Any, str]:
        """The filesystem for ``url``, made once per process: building an s3fs client costs
        ~0.3 s (and ``skip_instance_cache`` in the options would pay that per shard)."""
        import fsspec  # imported lazily: local datasets never pay for it

        protocol = url.split("://", 1)[0]
        with self._lock:
            if self._fs is None or self._fs[:2] != (os.getpid(), protocol):
                fs, _ = fsspec.core.url_to_fs(url, **self._options)
                self._fs = (os.getpid(), protocol, fs)
            fs = self._fs[2]
        return fs, fs._strip_protocol(url)

    def attempt(self, job: Job) -> None:
        try:
            fs, path = self._filesystem(job.url)
            if hasattr(fs, "_call_s3") and hasattr(fs, "split_path"):
                _read_s3(job, fs, path)
                return
            with fs.open(path, "rb", block_size=_CHUNK, cache_type="none") as f:
                self._read(job, fs, path, f)
        except (Fatal, Mismatch, Transient, CacheError):
            raise
        except ImportError as exc:  # the backend package is missing: say which extra has it
            raise Fatal(str(missing_extra(job.url.split("://", 1)[0], exc, job.shown))) from None
        except (FileNotFoundError, PermissionError, IsADirectoryError) as exc:
            raise Fatal(f"{type(exc).__name__} from the storage backend") from None
        except OSError as exc:
            changed = exc.errno == errno.EBUSY or type(exc).__name__ == "FileExpired" or (
                exc.errno == errno.EINVAL and "condition" in str(exc).lower())  # 412 on IfMatch
            if changed:
                job.restart("object changed mid-download (ETag)")
                raise Transient("object changed mid-download") from None
            raise Transient(f"storage error {type(exc).__name__}") from None
        except Exception as exc:  # noqa: BLE001 - backends raise their own types; retry is capped
            raise Transient(f"storage error {type(exc).__name__}") from None

    @staticmethod
    def _read(job: Job, fs: Any, path: str, f: Any) -> None:
        size = f.size
        if size != job.size:
            raise Mismatch(f"the stored object has {size} bytes, the manifest says {job.size}")
        details = getattr(f, "details", None) or {}
        etag = details.get("ETag") or details.get("etag")
        if job.offset and etag != job.etag:
            job.restart("object changed between attempts (ETag)")
        job.etag = etag
        f.seek(job.offset)
        while job.offset < job.size:
            want = min(_CHUNK, job.size - job.offset)
            data = f.read(want)
            if len(data) > want:
                job.restart("storage returned more than the requested range")
                whole = fs.cat_file(path)
                if len(whole) != job.size:
                    raise Mismatch(f"the stored object has {len(whole)} bytes, "
                                   f"the manifest says {job.size}")
                job.write(whole)
                return
            if not data:
                raise Transient(f"read ended after byte {job.offset} of {job.size}")
            job.write(data)


def _read_s3(job: Job, fs: Any, path: str) -> None:
    """S3 through s3fs's client: ranged GETs whose answers are checked, no HEAD first.

    Every response's ``Content-Range`` must start at the resume offset and report the
    manifest's size, so an ignored ``Range`` cannot be mistaken for a range; the first
    response's ETag is sent as ``IfMatch`` with every later range (and compared), so an object
    replaced mid-download restarts from zero instead of being spliced.
    """
    from fsspec.asyn import sync

    bucket, key, version = fs.split_path(path)
    while job.offset < job.size:
        start, end = job.offset, min(job.size, job.offset + _CHUNK)
        body, etag, content_range = sync(fs.loop, _get_range, fs, bucket, key, version, start,
                                         end, job.etag)
        first, total = _parse_content_range(content_range)
        if total is not None and total != job.size:
            raise Mismatch(f"the stored object has {total} bytes, the manifest says {job.size}")
        if first is None and len(body) != end - start:  # no Content-Range: Range was ignored
            job.restart("storage ignored the Range request")
            if len(body) != job.size:
                raise Mismatch(f"the stored object has {len(body)} bytes, "
                               f"the manifest says {job.size}")
            job.etag = etag
            job.write(body)
            return
        if first not in (None, start):
            raise Transient(f"storage sent bytes from {first}, asked for {start}")
        if job.etag and etag and etag != job.etag:
            job.restart("object changed mid-download (ETag)")
            raise Transient("object changed mid-download")
        if not body:
            raise Transient(f"read ended after byte {job.offset} of {job.size}")
        job.etag = job.etag or etag
        job.write(body[: end - start])


async def _get_range(fs: Any, bucket: str, key: str, version: str | None, start: int, end: int,
                     etag: str | None) -> tuple[bytes, str | None, str | None]:
    kw: dict[str, Any] = {"Range": f"bytes={start}-{end - 1}"}
    if etag:
        kw["IfMatch"] = etag
    if version:
        kw["VersionId"] = version
    resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, **kw)
    try:
        body = await resp["Body"].read()
    finally:
        resp["Body"].close()
    return body, resp.get("ETag"), resp.get("ContentRange")


def _parse_content_range(value: str | None) -> tuple[int | None, int | None]:
    """``bytes START-END/TOTAL`` -> (START, TOTAL); (None, None) when absent or unparseable."""
    try:
        span, _, total = (value or "").removeprefix("bytes ").partition("/")
        return int(span.split("-")[0]), (None if total in ("", "*") else int(total))
    except ValueError:
        return None, None


class LocalFetcher:
    """Copies a shard from a local path or ``file://`` URL (e.g. a network mount)."""

    def attempt(self, job: Job) -> None:
        path = job.url.removeprefix("file://")
        try:
            with open(path, "rb") as src:
                size = os.fstat(src.fileno()).st_size
                if size != job.size:
                    raise Mismatch(f"the file has {size} bytes, the manifest says {job.size}")
                src.seek(job.offset)
                before = job.offset
                shutil.copyfileobj(src, _Sink(job), _CHUNK)
                if job.offset - before != size - before:
                    raise Transient(f"file shrank while copying (at byte {job.offset})")
        except (FileNotFoundError, PermissionError, IsADirectoryError) as exc:
            raise Fatal(f"{type(exc).__name__}") from None
        except OSError as exc:
            raise Transient(f"read error {type(exc).__name__}") from None


class _Sink:
    __slots__ = ("_job",)

    def __init__(self, job: Job) -> None:
        self._job = job

    def write(self, data: bytes) -> int:
        self._job.write(bytes(data))
        return len(data)
