"""The record beside each cached shard that lets a warm restart trust it without re-hashing.

A shard file is trusted when its sidecar names the manifest's xxh3-128 for that shard and the
file still has the size and mtime recorded at commit. Any difference (a crash mid-commit, a
truncated or rewritten file) makes it untrusted; start-up repair then re-hashes or removes it.
Size and mtime cannot see bytes that changed in place (bit rot, a rewrite that restored the
mtime), so the cache also re-hashes a file each time it hands it out (``repair.content_problem``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

__all__ = ["Sidecar"]


@dataclass(frozen=True, slots=True)
class Sidecar:
    """What was verified about one committed shard file.

    Attributes:
        source_xxh3_128: the manifest's hash of the remote bytes that were verified.
        source_bytes: their size.
        local_xxh3_128: hash of the local file (differs from the source when materialised).
        size: local file size in bytes.
        mtime_ns: local file mtime at commit.
        materialised: True when the local file was rewritten uncompressed.
    """

    source_xxh3_128: str
    source_bytes: int
    local_xxh3_128: str
    size: int
    mtime_ns: int
    materialised: bool

    def matches(self, xxh3_128: str, st: os.stat_result) -> bool:
        """True if this record vouches for a file with stat ``st`` of manifest hash ``xxh3_128``."""
        return (self.source_xxh3_128 == xxh3_128 and self.size == st.st_size
                and self.mtime_ns == st.st_mtime_ns)

    def write(self, path: str) -> None:
        """Write atomically (temp file + rename) so a crash never leaves half a record."""
        # The writer holds the shard's lock, so "<name>.<pid>.tmp" is unique and start-up
        # repair can tell a live write from a crash leftover by trying that lock.
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(asdict(self), f, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @classmethod
    def read(cls, path: str) -> "Sidecar | None":
        """The record at ``path``, or ``None`` if it is missing or unreadable (treated as dirty)."""
        try:
            with open(path) as f:
                doc = json.load(f)
            return cls(**doc)
        except (OSError, ValueError, TypeError):
            return None
