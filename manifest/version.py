"""The installed stoker version, read from package metadata (kept in one place: pyproject)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["stoker_version"]


def stoker_version() -> str:
    """``importlib.metadata.version("stoker")``, or ``"0+unknown"`` when not installed."""
    try:
        return version("stoker")
    except PackageNotFoundError:
        return "0+unknown"
