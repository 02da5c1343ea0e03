"""Progress bars on stderr that stay quiet when nobody watches (not a TTY, or asked)."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["progress_bar", "wants_progress"]


def wants_progress(progress: bool | None) -> bool:
    """``progress`` if given, else whether stderr is a terminal."""
    if progress is not None:
        return bool(progress)
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def progress_bar(total: int, desc: str, unit: str, progress: bool | None) -> Any:
    """A tqdm bar on stderr (disabled per :func:`wants_progress`); use ``update(n)``/``close()``."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, file=sys.stderr,
                disable=not wants_progress(progress), dynamic_ncols=True, leave=False)
