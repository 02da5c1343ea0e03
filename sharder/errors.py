"""Typed errors of the sharder: every message names the thing, the value and the fix."""

from __future__ import annotations

from stoker.manifest import StokerError

__all__ = ["ShardOptionsError", "SharderError", "SourceValueError"]


class SharderError(StokerError):
    """Sharding cannot go on: a source is missing or bad, or the destination is unusable.

    Raised before anything is lost: a failed run leaves no manifest and no temp files, and
    shards already finished stay in place so that the next run resumes from them.
    """


class ShardOptionsError(SharderError, ValueError):
    """The options contradict each other or have an invalid value (bad usage, CLI exit 2)."""


class SourceValueError(SharderError, ValueError):
    """A value in an input file cannot be read or converted (a corrupt page, a date or number
    out of range). Names the file and, for Parquet, the row group and the column.

    Attributes:
        path: the input file.
        row_group: the Parquet row group holding the value, or ``None`` when unknown.
        column: the top-level column holding it, or ``None`` when unknown.
    """

    def __init__(self, message: str, path: str, row_group: int | None = None,
                 column: str | None = None) -> None:
        super().__init__(message)
        self.path, self.row_group, self.column = path, row_group, column
