"""Where stoker keeps things on a node by default: resolved here, in one place.

Every location is, in order: the explicit argument, then a ``STOKER_*`` environment variable,
then the platform cache directory (``$XDG_CACHE_HOME``, else ``~/.cache``) + ``/stoker``.
Derived data lives inside the node cache directory, so moving that one directory
(``STOKER_CACHE_DIR``) moves everything stoker writes:

=========================  ==============================================================
node shard cache           :func:`cache_dir`: ``$STOKER_CACHE_DIR``, else
                           ``<platform cache>/stoker``
row-major record files     :func:`records_dir`: ``$STOKER_ROW_MAJOR_DIR`` (empty: none, the
                           records stay in memory), else ``<cache dir>/row-major``
                           (:func:`cache_records_dir`, under the cache's byte limit)
Numba's kernel cache       ``$NUMBA_CACHE_DIR`` or Numba's own places while writable, else
                           :func:`numba_cache_fallbacks`: ``<cache dir>/numba``, then a
                           per-user directory in the system temp dir
=========================  ==============================================================

Nothing is created here; callers create (and check) what they use. This module sits in
``stoker.manifest``, which imports nothing of stoker's, so every package may use it.
"""

from __future__ import annotations

import os
import tempfile

__all__ = ["ENV_CACHE_DIR", "ENV_RECORDS_DIR", "cache_dir", "cache_records_dir",
           "numba_cache_fallbacks", "platform_cache_root", "records_dir"]

ENV_CACHE_DIR = "STOKER_CACHE_DIR"
"""The node cache directory (shards, and the derived data beside them)."""

ENV_RECORDS_DIR = "STOKER_ROW_MAJOR_DIR"
"""The directory of row-major record files; set but empty: keep records in memory only."""

_RECORDS = "row-major"
_NUMBA = "numba"


def platform_cache_root() -> str:
    """The user's cache directory: ``$XDG_CACHE_HOME`` (XDG base directories), else
    ``~/.cache``."""
    return os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")


def cache_dir(explicit: str | os.PathLike[str] | None = None) -> str:
    """The node cache directory: ``explicit``, else ``$STOKER_CACHE_DIR``, else
    ``<platform cache>/stoker``. An empty ``STOKER_CACHE_DIR`` counts as unset."""
    if explicit is not None:
        return os.fspath(explicit)
    return os.environ.get(ENV_CACHE_DIR) or os.path.join(platform_cache_root(), "stoker")


def records_dir(explicit: str | os.PathLike[str] | None = None,
                cache: str | os.PathLike[str] | None = None) -> str | None:
    """Where row-major record files go: ``explicit``, else ``$STOKER_ROW_MAJOR_DIR`` (set but
    empty: ``None``, records stay in memory), else ``<cache>/row-major``, where ``cache`` is
    the dataset's cache directory (``None`` or empty: :func:`cache_dir`, so
    ``STOKER_CACHE_DIR`` moves the records with the shards)."""
    if explicit is not None:
        return os.fspath(explicit)
    env = os.environ.get(ENV_RECORDS_DIR)
    if env is not None:
        return env or None
    return cache_records_dir(cache)


def cache_records_dir(cache: str | os.PathLike[str] | None = None) -> str:
    """The node cache's own records directory, ``<cache>/row-major`` (``cache`` ``None`` or
    empty: :func:`cache_dir`): record files there count against the cache's byte limit
    (``stoker.cache.store.derived``); records kept anywhere else have their own bound."""
    return os.path.join(cache_dir(cache or None), _RECORDS)


def numba_cache_fallbacks() -> list[str]:
    """Directories for Numba's kernel cache when neither ``$NUMBA_CACHE_DIR`` nor Numba's own
    places are writable, in order of preference: ``<cache dir>/numba``, then
    ``<system temp>/stoker-numba-<uid>`` (per user: another user's files would not be ours to
    write)."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return [os.path.join(cache_dir(), _NUMBA),
            os.path.join(tempfile.gettempdir(), f"stoker-numba-{uid}")]
