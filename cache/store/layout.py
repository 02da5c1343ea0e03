"""Where a dataset's files live inside a cache directory, and how their names are parsed.

```
CACHE_DIR/<manifest fingerprint>/
  shards/00000042.arrow   complete, verified (and materialised) shard 42; only ever renamed in
  meta/00000042.json      its sidecar (what was verified, size, mtime) for warm restarts
                          (written as 00000042.json.<pid>.tmp, then renamed)
  tmp/00000042.<reserved bytes>.<pid>.<part|mat>   in-flight download / materialisation
  locks/00000042.lock     per-shard flock: shared = pinned, exclusive = being written/evicted
  quarantine/00000042.<n> copies that failed verification (first to go when room is needed)
  budget.lock             flock serialising byte-budget decisions across processes
CACHE_DIR/row-major/      row-major record files of every dataset (derived data; counted under
                          a dataset's limit: stoker.cache.store.derived)
```
Names carry the manifest index, not the shard's path, so they are fixed-length and safe; the
reserved byte count in a temp file's name is how processes see each other's in-flight bytes.
"""

from __future__ import annotations

import contextlib
import os
import re

__all__ = ["Layout"]

_DATA = re.compile(r"^(\d{8,})\.arrow$")
_META = re.compile(r"^(\d{8,})\.json$")
_META_TMP = re.compile(r"^(\d{8,})\.json\.\d+\.tmp$")
_TMP = re.compile(r"^(\d{8,})\.(\d+)\.(\d+)\.(part|mat)$")


class Layout:
    """Paths of one dataset's cache directory (created on construction)."""

    __slots__ = ("budget_lock", "locks", "meta", "quarantine", "root", "shards", "tmp")

    BUDGET_LOCK = "budget.lock"

    def __init__(self, cache_dir: str | os.PathLike[str], fingerprint: str) -> None:
        self.root = os.path.join(os.fspath(cache_dir), fingerprint)
        self.shards = os.path.join(self.root, "shards")
        self.meta = os.path.join(self.root, "meta")
        self.tmp = os.path.join(self.root, "tmp")
        self.locks = os.path.join(self.root, "locks")
        self.quarantine = os.path.join(self.root, "quarantine")
        self.budget_lock = os.path.join(self.root, self.BUDGET_LOCK)
        for d in (self.shards, self.meta, self.tmp, self.locks, self.quarantine):
            os.makedirs(d, exist_ok=True)

    def data(self, index: int) -> str:
        return os.path.join(self.shards, f"{index:08d}.arrow")

    def sidecar(self, index: int) -> str:
        return os.path.join(self.meta, f"{index:08d}.json")

    def lock(self, index: int) -> str:
        return os.path.join(self.locks, f"{index:08d}.lock")

    def temp(self, index: int, reserve: int, kind: str) -> str:
        return os.path.join(self.tmp, f"{index:08d}.{reserve}.{os.getpid()}.{kind}")

    def quarantined(self, index: int) -> str:
        n = sum(1 for name in os.listdir(self.quarantine) if name.startswith(f"{index:08d}."))
        return os.path.join(self.quarantine, f"{index:08d}.{n}")

    @staticmethod
    def committed_in(root: str) -> list[tuple[int | None, int, str]]:
        """(shard index or None for a quarantined copy, size, path) of every committed file
        of the dataset directory ``root``: quarantined copies and shards."""
        out: list[tuple[int | None, int, str]] = []
        for sub in ("quarantine", "shards"):
            with contextlib.suppress(FileNotFoundError), os.scandir(os.path.join(root, sub)) as it:
                for entry in it:
                    idx = None if sub == "quarantine" else Layout.data_index(entry.name)
                    with contextlib.suppress(FileNotFoundError):
                        out.append((idx, entry.stat().st_size, entry.path))
        return out

    @staticmethod
    def data_index(name: str) -> int | None:
        m = _DATA.match(name)
        return int(m.group(1)) if m else None

    @staticmethod
    def meta_index(name: str) -> int | None:
        m = _META.match(name)
        return int(m.group(1)) if m else None

    @staticmethod
    def meta_temp_index(name: str) -> int | None:
        """Shard index of a sidecar being written (``NNNNNNNN.json.<pid>.tmp``), else None."""
        m = _META_TMP.match(name)
        return int(m.group(1)) if m else None

    @staticmethod
    def temp_info(name: str) -> tuple[int, int, int] | None:
        """(index, reserved bytes, pid) of a temp file name, or ``None`` if foreign."""
        m = _TMP.match(name)
        return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None
