"""Atomic, hashed file writes: temp file in the target folder, fsync, rename.

A reader never sees a partial file under a final name, and a failed write (disk full)
removes its temp file before the error is raised.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import xxhash

from stoker.sharder.errors import SharderError

__all__ = ["HashingFile", "TEMP_SUFFIX", "atomic_write", "write_bytes_atomic"]

TEMP_SUFFIX = ".stoker-tmp"
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
# The one place files are opened for writing; tests wrap it to simulate a full disk.
_open = open


class HashingFile:
    """A binary file wrapper that hashes (xxh3-128) and counts everything written through it.

    Pass it to ``pyarrow.PythonFile(..., mode="w")`` to hash an IPC file while writing it,
    without reading it back.
    """

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._hash = xxhash.xxh3_128()
        self.size = 0
        self.error: OSError | None = None
        self.closed = False

    def write(self, data: Any) -> int:
        try:
            n = self._raw.write(data)
        except OSError as exc:
            self.error = exc  # pyarrow may re-wrap it; keep the original for the message
            raise
        self._hash.update(data)
        self.size += len(memoryview(data).cast("B"))
        return n if n is not None else 0

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        self._raw.flush()

    def close(self) -> None:  # the owner closes the raw file after fsync
        self.closed = True

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def _fail(target: Path, exc: OSError) -> SharderError:
    if exc.errno in _DISK_FULL:
        return SharderError(f"disk full while writing {str(target)!r}; no manifest was written "
                            "and finished shards were kept. Free space (or choose another DST) "
                            "and run the same command again to resume.")
    return SharderError(f"cannot write {str(target)!r} ({type(exc).__name__}: "
                        f"{exc.strerror or exc}); check that DST is writable.")


@contextlib.contextmanager
def atomic_write(target: str | os.PathLike[str]) -> Iterator[HashingFile]:
    """Yield a hashing file object; on success its bytes appear at ``target`` atomically.

    Raises:
        SharderError: writing failed (disk full, permissions); the temp file is removed.
    """
    target = Path(target)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}{TEMP_SUFFIX}")
    try:
        with _open(tmp, "wb") as raw:
            out = HashingFile(raw)
            yield out
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _fail(target, exc) from exc
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        error = getattr(locals().get("out"), "error", None)
        if error is not None:
            raise _fail(target, error) from exc
        raise


def write_bytes_atomic(target: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``target`` atomically (see :func:`atomic_write`)."""
    with atomic_write(target) as f:
        f.write(data)
