"""Human byte sizes (``256MB``, ``1.5GiB``) to integers, with decimal and binary units."""

from __future__ import annotations

import re

from stoker.sharder.errors import ShardOptionsError

__all__ = ["format_size", "parse_size"]

_UNITS = {
    "": 1, "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes in ``text``: ``KB/MB/GB/TB`` are powers of 10, ``K/M/G/T`` and ``KiB..TiB`` of 2.

    Raises:
        ShardOptionsError: ``text`` is not a positive size such as ``256MB`` or ``64MiB``.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = _SIZE.match(str(text))
        unit = match.group(2).upper() if match else None
        if match is None or unit not in _UNITS:
            raise ShardOptionsError(
                f"size {text!r} is not a byte size; write a number with an optional unit, "
                "e.g. 256MB, 64MiB, 1GB or 1048576.")
        value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ShardOptionsError(f"size {text!r} must be at least 1 byte, e.g. 256MB.")
    return value


def format_size(n: float) -> str:
    """``n`` bytes for humans, decimal units (``1.23 GB``)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} TB"  # pragma: no cover - loop always returns
