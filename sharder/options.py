"""What a sharding run is asked to do, validated once in one small dataclass."""

from __future__ import annotations

from dataclasses import dataclass

from stoker.manifest import parse_size
from stoker.sharder.errors import ShardOptionsError

__all__ = ["BATCH_BYTES", "BATCH_ROWS", "DEFAULT_SHARD_SIZE", "FORMATS", "MIN_BATCH_BYTES",
           "ShardOptions"]

#: Target uncompressed Arrow bytes per record batch. Big enough that per-batch overhead
#: vanishes, small enough that a random-access read of one batch stays cheap.
BATCH_BYTES = 4 << 20
#: Most rows per record batch: the order's default block (1,024 rows). A staged round copies
#: runs of a block's rows; out of batches of at most that many rows a run is one or two
#: contiguous byte ranges of the shard (a 4-KiB page of each float32 column, side by side),
#: where out of 4 MiB batches it is a few KB of every column buffer, one small disk read each
#: past memory: 20 M W1 rows in a 6 GiB cgroup, a first run from the columns read 1.06-1.08 M
#: rows/s with batches of 1,024 rows against 0.67 M with 10,302 (4 MiB) and 0.75 M with 1,323
#: (512 KiB: its column buffers straddle pages, so a run is again one range per column).
BATCH_ROWS = 1024
#: ... unless that holds fewer bytes than this: a narrow table's run is a few contiguous
#: ranges in any layout, and batches of a few KB would only add metadata (one IPC message
#: each) and chunks.
MIN_BATCH_BYTES = 256 << 10
#: Shard size used when neither ``shard_size`` nor ``rows_per_shard`` is given.
DEFAULT_SHARD_SIZE = 256 * 10**6
FORMATS = ("csv", "jsonl", "parquet", "webdataset", "imagefolder", "hf", "tokens")
_COMPRESSIONS = ("none", "zstd")


@dataclass(frozen=True, slots=True)
class ShardOptions:
    """Options of :func:`stoker.sharder.shard` that shape the output.

    Attributes:
        rows_per_shard: exact rows per shard (the last one may be smaller).
        shard_size: target uncompressed bytes per shard (``"256MB"`` or an int); converted
            to rows from the inputs' average row size. Exclusive with ``rows_per_shard``.
        compression: ``"none"`` or ``"zstd"`` (Arrow IPC buffer compression).
        columns: columns to keep, in this order; ``None`` keeps all.
        format: ``"parquet"``, ``"csv"`` or ``"jsonl"``; ``None`` detects by extension.
        batch_bytes: target uncompressed bytes per record batch.
        batch_rows: most rows per record batch (:data:`BATCH_ROWS`), unless that many rows
            hold fewer than :data:`MIN_BATCH_BYTES` (or ``batch_bytes``, if smaller).
        token_dtype: ``"uint16"`` or ``"uint32"`` for token files (required for raw ``.bin``).
        seq_len: tokens per sequence for token files (see stoker.sharder.sources.tokens).
        on_bad: ``"error"`` (default) or ``"skip"``: image folders only, leave out unreadable
            images and non-image files, listed in the manifest (``provenance.options.skipped``).
    """

    rows_per_shard: int | None = None
    shard_size: int | str | None = None
    compression: str = "none"
    columns: tuple[str, ...] | None = None
    format: str | None = None
    batch_bytes: int = BATCH_BYTES
    batch_rows: int = BATCH_ROWS
    token_dtype: str | None = None
    seq_len: int | None = None
    on_bad: str = "error"

    def __post_init__(self) -> None:
        if self.rows_per_shard is not None and self.shard_size is not None:
            raise ShardOptionsError(
                f"got both rows_per_shard={self.rows_per_shard!r} and shard_size="
                f"{self.shard_size!r}; give only one of them.")
        if self.rows_per_shard is not None and (
                isinstance(self.rows_per_shard, bool) or not isinstance(self.rows_per_shard, int)
                or self.rows_per_shard < 1):
            raise ShardOptionsError(f"rows_per_shard={self.rows_per_shard!r} must be a "
                                    "positive integer, e.g. 100000.")
        if self.shard_size is not None:
            object.__setattr__(self, "shard_size", _shard_bytes(self.shard_size))
        if self.compression not in _COMPRESSIONS:
            raise ShardOptionsError(f"compression={self.compression!r} is not supported; "
                                    f"use one of {', '.join(_COMPRESSIONS)}.")
        if self.format is not None and self.format not in FORMATS:
            raise ShardOptionsError(f"format={self.format!r} is not supported; use one of "
                                    f"{', '.join(FORMATS)} (or leave it out to detect it).")
        if self.columns is not None:
            cols = (self.columns,) if isinstance(self.columns, str) else tuple(self.columns)
            if not cols or any(not isinstance(c, str) or not c for c in cols):
                raise ShardOptionsError(f"columns={self.columns!r} must be a non-empty list of "
                                        "column names, e.g. ['x', 'label'].")
            if len(set(cols)) != len(cols):
                raise ShardOptionsError(f"columns={list(cols)!r} names a column twice; "
                                        "list each column once.")
            object.__setattr__(self, "columns", cols)
        if isinstance(self.batch_bytes, bool) or not isinstance(self.batch_bytes, int) \
                or self.batch_bytes < 1:
            raise ShardOptionsError(f"batch_bytes={self.batch_bytes!r} must be a positive "
                                    "integer number of bytes.")
        if isinstance(self.batch_rows, bool) or not isinstance(self.batch_rows, int) \
                or self.batch_rows < 1:
            raise ShardOptionsError(f"batch_rows={self.batch_rows!r} must be a positive "
                                    "integer number of rows.")
        if self.token_dtype is not None and self.token_dtype not in ("uint16", "uint32"):
            raise ShardOptionsError(f"token_dtype={self.token_dtype!r} is not supported; use "
                                    "uint16 or uint32.")
        if self.on_bad not in ("error", "skip"):
            raise ShardOptionsError(f"on_bad={self.on_bad!r} is not supported; use 'error' or "
                                    "'skip' (image folders: skip unreadable images, recorded).")
        if self.seq_len is not None and (isinstance(self.seq_len, bool)
                                         or not isinstance(self.seq_len, int) or self.seq_len < 1):
            raise ShardOptionsError(f"seq_len={self.seq_len!r} must be a positive integer, "
                                    "e.g. 1024.")

    @property
    def target_shard_bytes(self) -> int:
        """The byte target used when ``rows_per_shard`` is not given."""
        return int(self.shard_size) if self.shard_size is not None else DEFAULT_SHARD_SIZE


def _shard_bytes(text: str | int) -> int:
    """``shard_size`` in bytes: a positive int, or a size such as ``256MB`` or ``64MiB``.

    Raises:
        ShardOptionsError: ``text`` is not a positive byte size (bad usage, CLI exit 2).
    """
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        try:
            value = parse_size(str(text))
        except ValueError:
            raise ShardOptionsError(
                f"size {text!r} is not a byte size; write a number with an optional unit, "
                "e.g. 256MB, 64MiB, 1GB or 1048576.") from None
    if value <= 0:
        raise ShardOptionsError(f"size {text!r} must be at least 1 byte, e.g. 256MB.")
    return value
