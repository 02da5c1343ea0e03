"""Downloads through fsspec (``s3://``, ``gs://``, ...) and plain local copies.

Reads go through ``fs.open(..., cache_type="none")`` in fixed chunks from the resume offset,
so an interrupted download continues where it stopped. s3fs pins the object's ETag at open
(``IfMatch``) and raises ``FileExpired`` if it changes mid-read; a new ETag on a later attempt
also restarts from zero. fsspec does not report whether a ranged read was honoured, so a
chunk longer than asked for (a server ignoring ``Range``) throws the partial file away and
takes the whole object in one read instead of splicing it.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
from typing import Any, Mapping

from stoker.cache.errors import CacheError
from stoker.cache.fetch import Fatal, Job, Mismatch, Transient

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
            with fs.open(path, "rb", block_size=_CHUNK, cache_type="none") as f:
                self._read(job, fs, path, f)
        except (Fatal, Mismatch, Transient, CacheError):
            raise
        except (FileNotFoundError, PermissionError, IsADirectoryError) as exc:
            raise Fatal(f"{type(exc).__name__} from the storage backend") from None
        except OSError as exc:
            if exc.errno == errno.EBUSY or type(exc).__name__ == "FileExpired":
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
