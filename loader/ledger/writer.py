"""The reproducibility ledger: what one rank of a run consumed, step by step.

``DataLoader(..., ledger="runs/a.ledger")`` creates a :class:`LedgerWriter` per rank; ``stoker
audit`` reads the files back with :func:`read_ledger` and replays the order to prove the run.
The byte format is specified in :mod:`stoker.loader.ledger.format`.

Files: one per rank. :func:`ledger_path` maps the run's ledger name to the rank's file:
``runs/a.ledger`` itself when ``world_size == 1``, else ``runs/a.rank{r}.ledger``; a name that
is an existing directory or ends with ``/`` gives ``DIR/rank{r:05d}.ledger``. The writer resolves
the name itself from ``header["rank"]`` and ``header["world_size"]``, so the loader passes the
name the user gave. ``stoker audit`` accepts one file or a directory (every ``*.ledger`` in it).

Appending: opening an existing ledger appends a new segment (a resumed run continues the
ledger it resumes). A tail left incomplete by a crash is cut off first and the number of
bytes dropped is recorded in the new segment's header (``"dropped_tail_bytes"``). One writer at
a time: a second live writer of the same file is refused (stoker.loader.ledger.lock); the
DataLoader also refuses to append to a ledger with progress unless it was resumed from a
state or continues exactly where the ledger ends (``check``).

Credentials never reach the file: header and event values are scrubbed before writing (keys
named ``key``/``auth`` or containing ``storage_option``, ``credential``, ``token``, ``secret``,
``password``, ``authorization``, ``api_key`` or ``access_key`` are dropped; URLs lose user
info, query string and fragment via :func:`stoker.manifest.redact_url`).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import socket
import threading
import time
import weakref
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from stoker.cache.lock import FileLock

from stoker.loader.ledger.format import (
    FRAME_END,
    FRAME_EVENTS,
    FRAME_HEADER,
    FRAME_STEPS,
    LEDGER_FORMAT,
    LedgerError,
    MAGIC,
    STEP_DTYPE,
    decode_steps,
    encode_frame,
    encode_steps,
    ids_digest,
    iter_frames,
)
from stoker.loader.ledger.lock import lock_ledger
from stoker.loader.ledger.reader import Ledger, LedgerSegment, content_columns, read_ledger
from stoker.manifest import is_url, redact_url, stoker_version

__all__ = ["Ledger", "LedgerError", "LedgerSegment", "LedgerWriter", "Progress", "ledger_path",
           "read_ledger", "scrub"]

_SECRET_WORDS = ("storage_option", "credential", "token", "secret", "password", "passwd",
                 "authorization", "api_key", "access_key")
_VERSIONED = ("torch", "numpy", "pyarrow", "numba", "zstandard")


def ledger_path(path: str | os.PathLike[str], rank: int = 0, world_size: int = 1) -> Path:
    """The file rank ``rank`` of ``world_size`` writes for the run ledger name ``path``."""
    text = os.fspath(path)
    p = Path(text)
    if text.endswith(("/", os.sep)) or p.is_dir():
        return p / f"rank{rank:05d}.ledger"
    if world_size == 1:
        return p
    stem, suffix = (p.stem, p.suffix) if p.suffix else (p.name, ".ledger")
    return p.with_name(f"{stem}.rank{rank}{suffix}")


def scrub(value: Any) -> Any:
    """A JSON-plain copy of ``value`` without credentials (see the module docstring)."""
    if isinstance(value, Mapping):
        return {str(k): scrub(v) for k, v in value.items() if not _is_secret_key(str(k))}
    if isinstance(value, (list, tuple)):
        return [scrub(v) for v in value]
    if isinstance(value, np.generic):
        return scrub(value.item())
    if isinstance(value, np.ndarray):
        return scrub(value.tolist())
    if isinstance(value, str):
        return redact_url(value) if is_url(value) else value
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if hasattr(value, "tolist"):  # torch tensors and friends
        return scrub(value.tolist())
    return str(value)


def _is_secret_key(key: str) -> bool:
    low = key.lower()
    return low in ("key", "auth") or any(word in low for word in _SECRET_WORDS)


def _versions() -> dict[str, str]:
    out = {"stoker": stoker_version(), "python": platform.python_version()}
    for name in _VERSIONED:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


@dataclass(frozen=True, slots=True)
class Progress:
    """What a ledger file held before this writer opened it.

    Attributes:
        header: the last segment's header (``None``: a new or empty file).
        last: ``(epoch, step)`` of the last step recorded (``None``: no step yet).
    """

    header: dict[str, Any] | None = None
    last: tuple[int, int] | None = None


def _open_for_append(path: Path) -> tuple[BinaryIO, int, int, Progress]:
    """Open ``path`` positioned after its last intact frame; returns (file, segment, dropped,
    what the file held). The caller holds the ledger's lock (stoker.loader.ledger.lock)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a+b")
    f.seek(0)
    data = f.read()
    if not data:
        f.write(MAGIC)
        return f, 0, 0, Progress()
    if not data.startswith(MAGIC):
        f.close()
        raise LedgerError(f"{path}: exists but is not a stoker ledger (no {MAGIC!r} magic); "
                          "pass a new ledger path or remove the file.")
    end, segments = len(MAGIC), 0
    header: dict[str, Any] | None = None
    last_steps: tuple[bytes, dict[str, Any]] | None = None
    for _, frame_stop, kind, raw in iter_frames(data):
        end = frame_stop
        segments += kind == FRAME_HEADER
        if kind == FRAME_HEADER:
            header = json.loads(raw)
        elif kind == FRAME_STEPS and header is not None:
            last_steps = (raw, header)
    if end < len(data):
        f.truncate(end)  # an incomplete frame left by a crash; its bytes were never readable
    f.seek(end)
    return f, segments, len(data) - end, Progress(header, _last_position(last_steps))


def _last_position(frame: tuple[bytes, dict[str, Any]] | None) -> tuple[int, int] | None:
    if frame is None:
        return None
    raw, header = frame
    records, _, _ = decode_steps(raw, bool(header.get("ids")), len(content_columns(header)))
    return (int(records["epoch"][-1]), int(records["step"][-1])) if len(records) else None


class _Sink:
    """File and buffers shared by a writer and its finaliser (which must not hold the writer)."""

    def __init__(self, f: BinaryIO, ids: bool, content_width: int = 0,
                 lock: FileLock | None = None) -> None:
        self.file: BinaryIO | None = f
        self.lock_file = lock
        self.ids = ids
        self.content_width = content_width
        self.rows: list[tuple[int, int, int, int, int, float, float]] = []
        self.id_chunks: list[np.ndarray] = []
        self.content: list[Sequence[int]] = []
        self.events: list[dict[str, Any]] = []
        self.steps = 0
        self.event_count = 0
        self.lock = threading.Lock()

    def flush_locked(self) -> None:
        if self.file is None:
            return
        out = b""
        if self.events:
            raw = json.dumps(self.events, separators=(",", ":"), allow_nan=False).encode()
            out += encode_frame(FRAME_EVENTS, raw)
            self.events = []
        if self.rows:
            records = np.array(self.rows, dtype=STEP_DTYPE)
            ids = np.concatenate(self.id_chunks) if self.ids else None
            content = np.array(self.content, dtype=np.uint64).reshape(
                len(self.rows), self.content_width) if self.content_width else None
            out += encode_frame(FRAME_STEPS, encode_steps(records, ids, content))
            self.rows, self.id_chunks, self.content = [], [], []
        if out:
            self.file.write(out)  # whole frames in one write: a kill leaves whole frames or a tail
            self.file.flush()

    def close(self) -> None:
        with self.lock:
            if self.file is None:
                return
            self.flush_locked()
            end = {"steps": self.steps, "events": self.event_count, "end_time": _now()}
            self.file.write(encode_frame(FRAME_END, json.dumps(end).encode()))
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            self.file = None
            if self.lock_file is not None:
                self.lock_file.release()


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


class LedgerWriter:
    """Appends one rank's steps and events to its ledger file.

    Thread-safe: ``step`` is called by the consumer, ``event`` possibly by workers. Records are
    buffered and written as whole compressed frames every ``flush_steps`` steps or
    ``flush_seconds`` seconds (checked at each step and event), on :meth:`flush`, and on
    :meth:`close` (also run at garbage collection and interpreter exit).

    Args:
        path: the run's ledger name; the rank's file is ``ledger_path(path, rank, world_size)``
            with rank and world size taken from ``header``.
        header: JSON-plain description of the run built by the loader. The writer adds
            ``versions``, ``host``, ``pid``, ``start_time``, ``ids``, ``format``, ``segment``.
        ids: also record every sample id (8 bytes per sample before compression).
        flush_steps: steps buffered before a frame is written.
        flush_seconds: longest time a step stays in memory before its frame is written.
        check: called with the file's :class:`Progress` before anything is written; it may
            raise (a :class:`LedgerError`) to refuse appending, e.g. a restart over a ledger
            with progress that was not resumed from a matching state (the DataLoader's check).

    Raises:
        LedgerError: the path is unusable, not a ledger, another live writer holds it
            (stoker.loader.ledger.lock), or ``check`` refused.
    """

    def __init__(self, path: str | os.PathLike[str], header: Mapping[str, Any], *,
                 ids: bool = False, flush_steps: int = 1024, flush_seconds: float = 5.0,
                 check: Callable[[Progress], None] | None = None) -> None:
        if flush_steps < 1 or flush_seconds <= 0:
            raise ValueError(f"flush_steps must be >= 1 and flush_seconds > 0, got "
                             f"{flush_steps=} {flush_seconds=}")
        rank, world = int(header.get("rank", 0)), int(header.get("world_size", 1))
        self.path = ledger_path(path, rank, world)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LedgerError(f"{self.path}: cannot create the ledger's directory "
                              f"({exc.strerror or exc}); pass a writable ledger path.") from None
        lock = lock_ledger(self.path)
        try:
            f, segment, dropped, progress = _open_for_append(self.path)
        except OSError as exc:
            lock.release()
            raise LedgerError(f"{self.path}: cannot open the ledger for writing "
                              f"({exc.strerror or exc}); pass a writable ledger path.") from None
        except BaseException:
            lock.release()
            raise
        self.progress = progress
        if check is not None:
            try:
                check(progress)
            except BaseException:
                f.close()
                lock.release()
                raise
        full = dict(scrub(header))
        full.update(format=LEDGER_FORMAT, ids=bool(ids), segment=segment, versions=_versions(),
                    host=socket.gethostname(), pid=os.getpid(), start_time=_now())
        if dropped:
            full["dropped_tail_bytes"] = dropped
        self.header: dict[str, Any] = full
        self._sink = _Sink(f, bool(ids), len(content_columns(full)), lock)
        self._flush_steps = flush_steps
        self._flush_seconds = flush_seconds
        self._t0 = time.monotonic()
        self._last_flush = self._t0
        raw = json.dumps(full, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
        f.write(encode_frame(FRAME_HEADER, raw))
        f.flush()
        self._finalizer = weakref.finalize(self, self._sink.close)

    def step(self, epoch: int, step: int, rank: int, ids: np.ndarray, wait_s: float,
             between_s: float, content: Sequence[int] | None = None) -> None:
        """Record that ``rank`` consumed ``ids`` (int64 global sample ids) at ``(epoch, step)``;
        ``content``: the batch's digests, one per column the header's ``"content"`` names."""
        ids = np.asarray(ids)
        sink = self._sink
        if sink.content_width and (content is None or len(content) != sink.content_width):
            raise LedgerError(f"{self.path}: the header declares {sink.content_width} content "
                              f"columns but step ({epoch}, {step}) brings "
                              f"{None if content is None else len(content)} digests.")
        with sink.lock:
            if sink.file is None:
                raise LedgerError(f"{self.path}: step() after close(); create a new LedgerWriter.")
            sink.rows.append((epoch, step, rank, len(ids), ids_digest(ids), wait_s, between_s))
            if sink.content_width:
                sink.content.append(content)  # type: ignore[arg-type]
            if sink.ids:
                sink.id_chunks.append(np.array(ids, dtype=np.int64))
            sink.steps += 1
            self._maybe_flush_locked()

    def event(self, kind: str, **data: Any) -> None:
        """Record an event (``"resume"``, ``"retry"``, ``"quarantine"``, ``"skip"``, ...).

        A ``"resume"`` event should carry ``epoch`` and ``step`` (the next step the loader will
        yield) and the loaded ``state``; the audit checks the stream continues exactly there.
        """
        sink = self._sink
        with sink.lock:
            if sink.file is None:
                raise LedgerError(f"{self.path}: event() after close(); create a new LedgerWriter.")
            record = {"kind": str(kind), "at": sink.steps,
                      "time": round(time.monotonic() - self._t0, 6)}
            record.update({k: v for k, v in scrub(data).items() if k not in record})
            sink.events.append(record)
            sink.event_count += 1
            self._maybe_flush_locked()

    def _maybe_flush_locked(self) -> None:
        now = time.monotonic()
        due = now - self._last_flush >= self._flush_seconds
        if due or len(self._sink.rows) >= self._flush_steps:
            self._sink.flush_locked()
            self._last_flush = now

    def flush(self) -> None:
        """Write buffered steps and events as complete frames now."""
        with self._sink.lock:
            self._sink.flush_locked()
            self._last_flush = time.monotonic()

    def close(self) -> None:
        """Flush, mark the segment as cleanly ended, fsync and close. Idempotent."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return self._sink.file is None

    def __enter__(self) -> LedgerWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LedgerWriter({str(self.path)!r}, steps={self._sink.steps}, closed={self.closed})"
