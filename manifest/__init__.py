"""stoker.manifest: the dataset contract (format stoker/1, hashing, validation).

This package imports nothing else of stoker's; every other package builds on it.
"""

from stoker.manifest.errors import ManifestError, ShardIntegrityError, StokerError
from stoker.manifest.hashing import canonical_json, hash_bytes, hash_file, hash_stream
from stoker.manifest.manifest import (
    FORMAT,
    MANIFEST_NAME,
    Manifest,
    ShardInfo,
    compute_fingerprint,
    describe_schema,
)
from stoker.manifest.paths import check_relative_path, is_url, join_location, redact_url
from stoker.manifest.version import stoker_version

__all__ = [
    "FORMAT",
    "MANIFEST_NAME",
    "Manifest",
    "ManifestError",
    "ShardInfo",
    "ShardIntegrityError",
    "StokerError",
    "canonical_json",
    "check_relative_path",
    "compute_fingerprint",
    "describe_schema",
    "hash_bytes",
    "hash_file",
    "hash_stream",
    "is_url",
    "join_location",
    "redact_url",
    "stoker_version",
]
