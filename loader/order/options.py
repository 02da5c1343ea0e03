"""How an epoch's order is built (:class:`OrderOptions`), the error of every invalid order
input (:class:`OrderError`) and the checks that raise it.

Kept apart from :mod:`stoker.loader.order.epoch` (which evaluates the order) because options
travel on their own: they are recorded in state dicts and ledgers, parsed back by replays and
audits, and validated where a DataLoader is built, long before any order is computed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker.manifest import StokerError

__all__ = ["ORDER_ALGORITHM", "OrderError", "OrderOptions", "check_int", "check_rank",
           "check_rows", "check_window"]

ORDER_ALGORITHM = "stoker.order/1"
"""Name and version of the order algorithm; part of every derived key and of ``to_dict()``."""

_MODES = ("redraw", "fixed")
_AUTO_SHARDS_PER_BLOCK = 4


class OrderError(StokerError, ValueError):
    """Invalid order options or an impossible request (position out of range, bad world size)."""


def check_int(name: str, value: Any, minimum: int | None = None) -> int:
    """``value`` as an int; :class:`OrderError` naming ``name`` if it is not one (bools are
    not) or is below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise OrderError(f"{name} must be an int, got {value!r} ({type(value).__name__}).")
    value = int(value)
    if minimum is not None and value < minimum:
        raise OrderError(f"{name} must be >= {minimum}, got {value}.")
    return value


@dataclass(frozen=True, slots=True)
class OrderOptions:
    """How an epoch's order is built; recorded in state dicts and ledgers.

    Attributes:
        shuffle: ``False`` gives natural order (``O[k] = k``).
        partitions: ``P``, the canonical partitions. The order is identical for every world
            size ``W`` that divides ``P``; the default 32 allows W in {1, 2, 4, ..., 32}. It was
            chosen by measurement (bench/shuffle_quality.py): on label-sorted data a batch of
            256 holds 75 distinct labels of 100 at P=32 against 92 for a true permutation,
            28 at P=8 and 87 at P=64, while the live shard set grows as ``P/W * 5``.
        block_size: ``K`` samples per shuffle block; ``0`` = auto, resolved by :meth:`resolve`
            to 4 x the (upper) median row count of the non-empty shards, so a block spans a few
            shards and a reader keeps about ``P/W * 5`` shards open.
        partition_mode: ``"redraw"`` re-draws the shards of each partition every epoch (better
            mixing); ``"fixed"`` keeps each partition's shards across epochs (each node's cache
            stays useful) and only changes the order inside a partition.
    """

    shuffle: bool = True
    partitions: int = 32
    block_size: int = 0
    partition_mode: str = "redraw"

    def __post_init__(self) -> None:
        if not isinstance(self.shuffle, (bool, np.bool_)):
            raise OrderError(f"shuffle must be True or False, got {self.shuffle!r}.")
        if isinstance(self.partitions, bool) or not isinstance(self.partitions, (int, np.integer)) \
                or self.partitions < 1:
            raise OrderError(f"partitions must be a positive int (the canonical partition count "
                             f"P; world sizes must divide it), got {self.partitions!r}.")
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, (int, np.integer)) \
                or self.block_size < 0:
            raise OrderError(f"block_size must be an int >= 0 (0 = auto: 4 x median shard rows), "
                             f"got {self.block_size!r}.")
        if self.partition_mode not in _MODES:
            raise OrderError(f"partition_mode must be one of {_MODES}, "
                             f"got {self.partition_mode!r}.")

    def resolve(self, shard_rows: np.ndarray) -> "OrderOptions":
        """These options with ``block_size`` filled in for ``shard_rows``.

        Natural order (``shuffle=False``) canonicalises to ``partitions=1, block_size=1,
        partition_mode="redraw"``, so equal orders have equal options.
        """
        if self.block_size:
            return _canonical(self, self.block_size)
        rows = check_rows(shard_rows)
        nonempty = np.sort(rows[rows > 0])
        median = int(nonempty[len(nonempty) // 2]) if len(nonempty) else 1
        return _canonical(self, max(1, _AUTO_SHARDS_PER_BLOCK * median))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict, with the algorithm name for replays."""
        return {"algorithm": ORDER_ALGORITHM, "shuffle": bool(self.shuffle),
                "partitions": int(self.partitions), "block_size": int(self.block_size),
                "partition_mode": str(self.partition_mode)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "OrderOptions":
        """Inverse of :meth:`to_dict`; missing keys take defaults, unknown keys are an error."""
        if not isinstance(d, dict):
            raise OrderError(f"order options must be a dict, got {type(d).__name__}.")
        d = dict(d)
        algorithm = d.pop("algorithm", ORDER_ALGORITHM)
        if algorithm != ORDER_ALGORITHM:
            raise OrderError(f"order options were written by algorithm {algorithm!r}; this stoker "
                             f"implements {ORDER_ALGORITHM!r}. Replay with the stoker version "
                             "that wrote them.")
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise OrderError(f"unknown order option(s) {unknown}; known: shuffle, partitions, "
                             "block_size, partition_mode.")
        return cls(**d)


def _canonical(opts: OrderOptions, block_size: int) -> OrderOptions:
    if not opts.shuffle:
        return OrderOptions(shuffle=False, partitions=1, block_size=1, partition_mode="redraw")
    return dataclasses.replace(opts, shuffle=True, partitions=int(opts.partitions),
                               block_size=int(block_size))


def check_window(start: int, stop: int, num_samples: int) -> tuple[int, int]:
    """``(start, stop)`` as ints; :class:`OrderError` unless ``0 <= start <= stop <=
    num_samples`` (an order's positions)."""
    start, stop = int(start), int(stop)
    if not 0 <= start <= stop <= num_samples:
        raise OrderError(f"positions [start, stop) = [{start}, {stop}) must satisfy "
                         f"0 <= start <= stop <= num_samples = {num_samples}.")
    return start, stop


def check_rank(rank: int, world_size: int) -> None:
    """:class:`OrderError` unless ``0 <= rank < world_size``."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise OrderError(f"rank must be in [0, world_size={world_size}), got {rank}.")


def check_rows(shard_rows: Any) -> np.ndarray:
    """Per-shard sample counts as a 1-D int64 array; :class:`OrderError` for any other shape,
    dtype or a negative count."""
    rows = np.asarray(shard_rows)
    if rows.ndim != 1 or (rows.size and rows.dtype.kind not in "iu"):
        raise OrderError(f"shard_rows must be a 1-D integer array of per-shard sample counts, got "
                         f"shape {rows.shape} dtype {rows.dtype}.")
    rows = rows.astype(np.int64, copy=False)
    if rows.size and int(rows.min()) < 0:
        bad = int(np.flatnonzero(rows < 0)[0])
        raise OrderError(f"shard_rows[{bad}] is {int(rows[bad])}; sample counts must be >= 0.")
    return rows

