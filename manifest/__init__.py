"""stoker.manifest: the dataset contract (format stoker/1, hashing, validation).

This package imports nothing else of stoker's; every other package builds on it.
"""

from stoker.manifest.errors import ManifestError, ShardIntegrityError, StokerError
from stoker.manifest.hashing import (canonical_json, hash_bytes, hash_file, hash_file_ranges,
                                     hash_range, hash_stream)
from stoker.manifest.manifest import (
    FORMAT,
    MANIFEST_NAME,
    Manifest,
    ShardInfo,
    compute_fingerprint,
    describe_schema,
)
from stoker.manifest.path_rules import check_relative_path, path_problem, resolve_inside
from stoker.manifest.paths import is_url, join_location, redact_url
from stoker.manifest.sizes import format_size, parse_size
from stoker.manifest.version import stoker_version
from stoker.manifest.webdataset_columns import (
    KEY_COLUMN,
    SampleFormatError,
    base_plus_ext,
    column_type,
    is_meta,
    parse_members,
    samples_to_table,
    tar_schema,
    typed_value,
)

__all__ = [
    "FORMAT",
    "KEY_COLUMN",
    "MANIFEST_NAME",
    "Manifest",
    "ManifestError",
    "SampleFormatError",
    "ShardInfo",
    "ShardIntegrityError",
    "StokerError",
    "base_plus_ext",
    "canonical_json",
    "check_relative_path",
    "column_type",
    "compute_fingerprint",
    "describe_schema",
    "format_size",
    "hash_bytes",
    "hash_file",
    "hash_file_ranges",
    "hash_range",
    "hash_stream",
    "is_meta",
    "is_url",
    "join_location",
    "parse_members",
    "parse_size",
    "path_problem",
    "redact_url",
    "resolve_inside",
    "samples_to_table",
    "stoker_version",
    "tar_schema",
    "typed_value",
]
