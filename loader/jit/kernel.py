"""The one place stoker compiles Numba kernels, with a cache directory that is always writable.

``@njit(cache=True)`` picks a cache locator when a kernel is *defined*; if neither an explicit
``NUMBA_CACHE_DIR``, the package's ``__pycache__`` nor ``~/.cache/numba`` is writable, Numba
raises ``RuntimeError: cannot cache function ...: no locator available`` at import time (see
shared/FIELD-NOTES.md). Read-only site-packages on a cluster node with a read-only ``$HOME`` is
a common case, so :func:`kernel` checks first and, when needed, points ``NUMBA_CACHE_DIR`` at a
writable fallback (the user cache dir, else the system temp dir), with a warning when a value the
user set had to be replaced. If nothing at all is writable the kernels compile without caching.
"""

from __future__ import annotations

import functools
import os
import tempfile
import warnings
from typing import Callable, TypeVar

import numba

__all__ = ["KernelCacheWarning", "choose_cache_dir", "kernel"]

F = TypeVar("F", bound=Callable[..., object])


class KernelCacheWarning(RuntimeWarning):
    """Compiled kernels are cached somewhere else than asked, or not cached at all."""


def _writable_dir(path: str) -> bool:
    """Whether ``path`` exists or can be created, and a file can be written inside it."""
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


def _numba_user_cache_dir() -> str:
    from numba.misc.appdirs import AppDirs

    return str(AppDirs(appname="numba", appauthor=False).user_cache_dir)


def _fallback_dirs() -> list[str]:
    user_cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return [os.path.join(user_cache, "stoker", "numba"),
            os.path.join(tempfile.gettempdir(), f"stoker-numba-{uid}")]


def choose_cache_dir(env_value: str | None, default_dirs: list[str],
                     fallbacks: list[str]) -> tuple[str | None, str | None]:
    """Decide where compiled kernels go.

    Args:
        env_value: the current ``NUMBA_CACHE_DIR`` (``None`` or ``""`` when unset).
        default_dirs: the directories Numba itself would try (in-tree ``__pycache__``,
            its user-wide cache dir).
        fallbacks: writable candidates to use instead, in order of preference.

    Returns:
        ``(cache_dir, warning)``: ``cache_dir`` is the directory to put in ``NUMBA_CACHE_DIR``
        (``None``: leave Numba's own choice alone; ``""``: nothing is writable, compile without
        a cache); ``warning`` is a message to emit, or ``None``.
    """
    if env_value:
        if _writable_dir(env_value):
            return None, None
        # Any writable directory serves as NUMBA_CACHE_DIR, Numba's own defaults included.
        fallback = next((d for d in fallbacks + default_dirs if _writable_dir(d)), "")
        where = repr(fallback) if fallback else "nowhere (kernels are compiled on every run)"
        return fallback, (f"NUMBA_CACHE_DIR={env_value!r} is not a writable directory; stoker "
                          f"caches its compiled kernels in {where} instead. Point "
                          "NUMBA_CACHE_DIR at a writable directory to silence this warning.")
    if any(_writable_dir(d) for d in default_dirs):
        return None, None
    fallback = next((d for d in fallbacks if _writable_dir(d)), "")
    if fallback:
        return fallback, None
    return "", ("no writable directory for Numba's cache (tried the package's __pycache__, "
                f"{', '.join(default_dirs[1:] + fallbacks)}); stoker's kernels are compiled on "
                "every run. Set NUMBA_CACHE_DIR to a writable directory to cache them.")


@functools.lru_cache(maxsize=None)
def _prepare_cache(source_dir: str) -> bool:
    """Make sure kernels defined in ``source_dir`` can be cached; return whether they can."""
    current = os.environ.get("NUMBA_CACHE_DIR")
    defaults = [os.path.join(source_dir, "__pycache__"), _numba_user_cache_dir()]
    cache_dir, message = choose_cache_dir(current, defaults, _fallback_dirs())
    if message:
        warnings.warn(message, KernelCacheWarning, stacklevel=4)
    if cache_dir:
        os.environ["NUMBA_CACHE_DIR"] = cache_dir
        # Numba read the environment when it was imported; its locators read this attribute.
        numba.config.CACHE_DIR = cache_dir
    return cache_dir != ""


def kernel(fn: F) -> F:
    """Compile ``fn`` with ``@njit(cache=True, nogil=True)`` after securing a cache directory.

    Every stoker kernel goes through here, so the cache fallback and the compile flags live in
    one place. Kernels are compiled lazily, at their first call with a new signature.
    """
    import inspect

    source_dir = os.path.dirname(os.path.abspath(inspect.getfile(fn)))
    cache = _prepare_cache(source_dir)
    return numba.njit(cache=cache, nogil=True)(fn)  # type: ignore[no-any-return]
