"""From the DataLoader's keywords to one checked set of options, old spellings included.

The keywords stoker's DataLoader took before its options were grouped (``partitions=``,
``cache_limit=``, ``worker_mode=``, ...) keep working for one release: each is folded into its
option object with a :class:`StokerDeprecationWarning` naming the new spelling (CHANGELOG.md
lists them). Passing an old keyword beside the option object that now holds it is an error:
two spellings of one option cannot disagree silently.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass
from typing import Any, Mapping

from stoker.loader.errors import OptionsError
from stoker.loader.options.groups import (CacheOptions, LedgerOptions, ReadOptions,
                                          ShuffleOptions, WorkerOptions)

__all__ = ["LEGACY", "LoaderOptions", "StokerDeprecationWarning", "resolve_options"]


class StokerDeprecationWarning(DeprecationWarning):
    """An old spelling of a stoker option; the message names the new one."""


# old keyword -> (DataLoader keyword, option class, field); cache_options held several fields
LEGACY: dict[str, tuple[str, type, str | None]] = {
    "features": ("read", ReadOptions, "features"),
    "categoricals": ("read", ReadOptions, "categoricals"),
    "image": ("read", ReadOptions, "image"),
    "row_major": ("read", ReadOptions, "row_major"),
    "row_major_dir": ("read", ReadOptions, "records_dir"),
    "partitions": ("shuffle", ShuffleOptions, "partitions"),
    "block_size": ("shuffle", ShuffleOptions, "block_size"),
    "partition_mode": ("shuffle", ShuffleOptions, "partition_mode"),
    "cache_dir": ("cache", CacheOptions, "dir"),
    "cache_limit": ("cache", CacheOptions, "limit"),
    "storage_options": ("cache", CacheOptions, "storage_options"),
    "cache_options": ("cache", CacheOptions, None),
    "ledger_ids": ("ledger", LedgerOptions, "ids"),
    "ledger_content": ("ledger", LedgerOptions, "content"),
    "worker_mode": ("workers", WorkerOptions, "mode"),
    "sample_seeding": ("workers", WorkerOptions, "sample_seeding"),
    "service": ("workers", WorkerOptions, "service"),
}


@dataclass(frozen=True, slots=True)
class LoaderOptions:
    """Everything stoker's own keywords decide, checked.

    ``shuffle`` is torch's flag; ``order`` refines it (``ShuffleOptions()`` when not given).
    ``cache.dir is None`` and a local dataset: no cache. ``ledger is None``: no ledger.
    """

    shuffle: bool
    order: ShuffleOptions
    read: ReadOptions
    cache: CacheOptions
    ledger: LedgerOptions | None
    workers: WorkerOptions


def _group(value: Any, cls: type, what: str, path_field: str | None = None) -> Any:
    if value is None or isinstance(value, cls):
        return value
    if path_field is not None and isinstance(value, (str, os.PathLike)):
        return cls(**{path_field: value})
    accepted = f"a path or a {cls.__name__}" if path_field else f"a {cls.__name__} or None"
    raise OptionsError(f"{what}={value!r} must be {accepted}.")


def _legacy_fields(legacy: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The old keywords as ``{DataLoader keyword: {field: value}}``, each warned about."""
    unknown = sorted(set(legacy) - set(LEGACY))
    if unknown:
        raise TypeError(f"DataLoader.__init__() got an unexpected keyword argument {unknown[0]!r}")
    fields: dict[str, dict[str, Any]] = {}
    for old, value in legacy.items():
        keyword, cls, field = LEGACY[old]
        new = f"{keyword}={cls.__name__}({field or '...'}=...)"
        warnings.warn(f"DataLoader({old}=...) is deprecated and will be removed in the next "
                      f"release; pass {new} (stoker.loader.{cls.__name__}).",
                      StokerDeprecationWarning, stacklevel=4)
        if field is None:  # cache_options: ShardCache keyword arguments
            known = {f.name for f in dataclasses.fields(CacheOptions)}
            bad = sorted(set(value or {}) - known)
            if bad:
                raise OptionsError(f"cache_options has unknown key(s) {bad}; CacheOptions takes "
                                   f"{sorted(known)}.")
            fields.setdefault(keyword, {}).update(value or {})
        else:
            fields.setdefault(keyword, {})[field] = value
    return fields


def resolve_options(shuffle: Any, read: Any, cache: Any, ledger: Any, workers: Any,
                    legacy: Mapping[str, Any]) -> LoaderOptions:
    """Check stoker's keywords of ``DataLoader`` and fold the old spellings in.

    Raises:
        OptionsError: a value of the wrong kind, or an old keyword given beside the option
            object that replaces it.
        TypeError: a keyword the DataLoader never took.
    """
    # an option object replaces the old keywords; a plain path (cache=, ledger=) combines
    # with them, as cache_dir= and ledger= did
    given = {"shuffle": isinstance(shuffle, ShuffleOptions), "read": read is not None,
             "cache": isinstance(cache, CacheOptions) or ("cache_dir" in legacy
                                                          and cache is not None),
             "ledger": isinstance(ledger, LedgerOptions), "workers": workers is not None}
    groups: dict[str, Any] = {
        "shuffle": shuffle if isinstance(shuffle, ShuffleOptions) else ShuffleOptions(),
        "read": _group(read, ReadOptions, "read") or ReadOptions(),
        "cache": _group(cache, CacheOptions, "cache", "dir") or CacheOptions(),
        "ledger": _group(ledger, LedgerOptions, "ledger", "path"),
        "workers": _group(workers, WorkerOptions, "workers") or WorkerOptions(),
    }
    for keyword, fields in _legacy_fields(legacy).items():
        if given[keyword]:
            old = ", ".join(f"{k}=" for k in legacy if LEGACY[k][0] == keyword)
            raise OptionsError(f"DataLoader got both {keyword}={groups[keyword]!r} and the old "
                               f"keyword(s) {old}; pass everything in {keyword}=.")
        if groups[keyword] is None:  # ledger_ids= without a ledger: nothing to record
            continue
        groups[keyword] = dataclasses.replace(groups[keyword], **fields)
    return LoaderOptions(shuffle=bool(shuffle), order=groups["shuffle"], read=groups["read"],
                         cache=groups["cache"], ledger=groups["ledger"],
                         workers=groups["workers"])
