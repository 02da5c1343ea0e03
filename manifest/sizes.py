"""Byte sizes written the way people write them (``"50GB"``, ``"512 MiB"``, ``10**9``), both ways.

One parser for every option that takes a size (the cache's ``limit``, the sharder's
``shard_size``, the loader's ``cache_limit``); each caller words its own errors if it must.
"""

from __future__ import annotations

import re

__all__ = ["format_size", "parse_size"]

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
          "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50,
          "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40, "PIB": 1 << 50}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(value: int | str, name: str = "size") -> int:
    """Return ``value`` in bytes.

    Decimal units (``KB``, ``MB``, ``GB``, ``TB``) are powers of 1000, binary ones (``KiB``,
    ``MiB``, ``GiB``, or the bare ``K``/``M``/``G`` of ``du -h``) powers of 1024.

    Raises:
        ValueError: for negative numbers, unknown units or anything that is not a size.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a byte count or a string like '50GB', got {value!r}.")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{name} must be >= 0 bytes, got {value}.")
        return value
    if isinstance(value, str):
        match = _PATTERN.match(value)
        if match and match.group(2).upper() in _UNITS:
            return int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    raise ValueError(f"{name} must be a byte count or a string like '50GB' or '512MiB', "
                     f"got {value!r}.")


def format_size(n: float) -> str:
    """``n`` bytes for humans, decimal units (``1.23 GB``)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} TB"  # pragma: no cover - loop always returns
