"""Read a ledger file back: segments of header, step records, events and optional ids.

Reading never fails on a damaged tail: it keeps every intact frame and reports where the
readable part ends (``Ledger.truncated``/``truncated_at``), because a ledger cut short by a
crash is exactly the evidence an audit must still be able to show.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stoker.loader.ledger.format import (
    FRAME_END,
    FRAME_EVENTS,
    FRAME_HEADER,
    FRAME_STEPS,
    MAGIC,
    STEP_DTYPE,
    LedgerError,
    decode_steps,
    iter_frames,
)

__all__ = ["Ledger", "LedgerSegment", "content_columns", "read_ledger"]


@dataclass(slots=True)
class LedgerSegment:
    """What one writer (one loader in one process) appended: header, steps, events, ids.

    Attributes:
        header: the JSON header the writer wrote when it opened the file.
        steps: step records (``STEP_DTYPE``) in the order they were consumed.
        events: event dicts; ``event["at"]`` indexes ``steps`` (steps recorded before it).
        ids: all sample ids, concatenated in step order, when the header says ``ids``.
        end: the clean-close record, or ``None`` when the process ended without ``close()``.
        content: u64 ``[steps, C]`` content digests, one per step and column of
            ``header["content"]["columns"]``, when the header declares them.
    """

    header: dict[str, Any]
    steps: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=STEP_DTYPE))
    events: list[dict[str, Any]] = field(default_factory=list)
    ids: np.ndarray | None = None
    end: dict[str, Any] | None = None
    content: np.ndarray | None = None

    @property
    def content_columns(self) -> list[str]:
        """The columns of :attr:`content` (``[]`` when the segment recorded none)."""
        return content_columns(self.header)

    @property
    def closed(self) -> bool:
        return self.end is not None

    @property
    def id_offsets(self) -> np.ndarray:
        """``ids[id_offsets[i]:id_offsets[i + 1]]`` are the ids of ``steps[i]``."""
        return np.concatenate([[0], np.cumsum(self.steps["count"], dtype=np.int64)])

    def step_ids(self, i: int) -> np.ndarray | None:
        if self.ids is None:
            return None
        off = self.id_offsets
        return self.ids[off[i]:off[i + 1]]


@dataclass(slots=True)
class Ledger:
    """A whole ledger file.

    Attributes:
        path: the file read.
        segments: one per writer that opened the file, in file order.
        size: file size in bytes.
        truncated: True when bytes after the last intact frame could not be read (a crash).
        truncated_at: byte offset where the unreadable tail starts, else ``None``.
    """

    path: str
    segments: list[LedgerSegment]
    size: int
    truncated: bool = False
    truncated_at: int | None = None

    @property
    def header(self) -> dict[str, Any]:
        """The first segment's header (``{}`` for a file cut before its first header)."""
        return self.segments[0].header if self.segments else {}

    @property
    def steps(self) -> np.ndarray:
        """Every step record of every segment, in file order."""
        if not self.segments:
            return np.empty(0, dtype=STEP_DTYPE)
        return np.concatenate([s.steps for s in self.segments])

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every event with ``segment`` added and ``at`` re-based onto :attr:`steps`."""
        out, base = [], 0
        for i, seg in enumerate(self.segments):
            out += [{**e, "segment": i, "at": e["at"] + base} for e in seg.events]
            base += len(seg.steps)
        return out

    @property
    def ids(self) -> np.ndarray | None:
        """All recorded ids in step order, or ``None`` unless every segment recorded them."""
        if not self.segments or any(s.ids is None for s in self.segments):
            return None
        return np.concatenate([s.ids for s in self.segments])


def read_ledger(path: str | os.PathLike[str]) -> Ledger:
    """Read the ledger at ``path``; raises :class:`LedgerError` if it is not a ledger at all."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise LedgerError(f"{p}: cannot read the ledger ({exc.strerror or exc}); pass the path "
                          "of a file written with DataLoader(ledger=...).") from None
    if not data.startswith(MAGIC):
        if len(data) < len(MAGIC) and MAGIC.startswith(data):
            return Ledger(str(p), [], len(data), truncated=True, truncated_at=0)
        raise LedgerError(f"{p}: not a stoker ledger (the file does not start with {MAGIC!r}); "
                          "pass a file written with DataLoader(ledger=...).")
    parts: list[_Parts] = []
    end, truncated_at = len(MAGIC), None
    for offset, stop, kind, raw in iter_frames(data):
        try:
            _apply(parts, kind, raw)
        except (ValueError, KeyError, TypeError):
            truncated_at = offset
            break
        end = stop
    if truncated_at is None and end < len(data):
        truncated_at = end
    return Ledger(str(p), [part.build() for part in parts], len(data), truncated_at is not None,
                  truncated_at)


@dataclass(slots=True)
class _Parts:
    """A segment being read: frames are collected, then joined once."""

    header: dict[str, Any]
    steps: list[np.ndarray] = field(default_factory=list)
    ids: list[np.ndarray] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    end: dict[str, Any] | None = None
    content: list[np.ndarray] = field(default_factory=list)

    def build(self) -> LedgerSegment:
        steps = np.concatenate(self.steps) if self.steps else np.empty(0, dtype=STEP_DTYPE)
        ids = content = None
        if self.header.get("ids"):
            ids = np.concatenate(self.ids) if self.ids else np.empty(0, dtype=np.int64)
        width = len(content_columns(self.header))
        if width:
            content = np.concatenate(self.content) if self.content else \
                np.empty((0, width), dtype=np.uint64)
        return LedgerSegment(self.header, steps, self.events, ids, self.end, content)


def content_columns(header: dict[str, Any]) -> list[str]:
    """The content-digest columns a segment header declares (``[]``: none)."""
    content = header.get("content")
    if not isinstance(content, dict) or not isinstance(content.get("columns"), list):
        return []
    return [str(c) for c in content["columns"]]


def _apply(parts: list[_Parts], kind: int, raw: bytes) -> None:
    """Add one decoded frame; ValueError when it makes no sense where it is."""
    if kind == FRAME_HEADER:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError("header frame is not a JSON object")
        parts.append(_Parts(header))
        return
    if not parts or parts[-1].end is not None:
        raise ValueError("frame outside a segment")
    seg = parts[-1]
    if kind == FRAME_STEPS:
        records, ids, content = decode_steps(raw, bool(seg.header.get("ids")),
                                             len(content_columns(seg.header)))
        seg.steps.append(records)
        if ids is not None:
            seg.ids.append(ids)
        if content is not None:
            seg.content.append(content)
    elif kind == FRAME_EVENTS:
        events = json.loads(raw)
        if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
            raise ValueError("events frame is not a JSON list of objects")
        seg.events += events
    elif kind == FRAME_END:
        seg.end = json.loads(raw)
