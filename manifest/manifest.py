"""The stoker/1 manifest: load, validate, build, fingerprint and save a dataset description.

See ``FORMAT.md`` beside this file for the specification and a worked example.
"""

from __future__ import annotations

import base64
import gc
import json
import os
import tempfile
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Sequence

import fastjsonschema
import numpy as np
import pyarrow as pa

from stoker.manifest.errors import ManifestError
from stoker.manifest.hashing import canonical_json, hash_bytes
from stoker.manifest.path_rules import check_shard_paths
from stoker.manifest.paths import is_url, join_location, redact_url
from stoker.manifest.remote_read import read_remote

__all__ = ["FORMAT", "MANIFEST_NAME", "Manifest", "ShardInfo", "compute_fingerprint", "decode_runs",
           "describe_schema", "encode_runs"]

FORMAT = "stoker/1"
MANIFEST_NAME = "manifest.json"

# Fields that define the data; everything else (creation time, tool version) is left out of
# the fingerprint so the same data + options fingerprint the same on any machine.
_UNHASHED_TOP = ("fingerprint", "created")
_UNHASHED_PROVENANCE = ("stoker_version",)


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """One shard as the manifest lists it."""

    path: str
    rows: int
    bytes: int
    xxh3_128: str
    batch_rows: tuple[int, ...]
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"path": self.path, "rows": self.rows, "bytes": self.bytes,
                             "xxh3_128": self.xxh3_128, "batches": encode_runs(self.batch_rows)}
        if self.extra:
            d["extra"] = dict(self.extra)
        return d


def encode_runs(batch_rows: Sequence[int]) -> list[list[int]]:
    """Record-batch row counts as ``[rows, repeat]`` runs: a shard cut by bytes has all
    batches equal but the last, so 64 batches take two pairs instead of 64 numbers."""
    runs: list[list[int]] = []
    for rows in batch_rows:
        if runs and runs[-1][0] == rows:
            runs[-1][1] += 1
        else:
            runs.append([int(rows), 1])
    return runs


def decode_runs(runs: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """Inverse of :func:`encode_runs`."""
    return tuple(rows for rows, repeat in runs for _ in range(repeat))


def describe_schema(schema: pa.Schema) -> dict[str, Any]:
    """The manifest's ``schema`` object: a readable field list plus the exact IPC schema."""
    schema = schema.remove_metadata()
    return {
        "fields": [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in schema],
        "arrow": base64.b64encode(schema.serialize().to_pybytes()).decode("ascii"),
    }


def _load_validator() -> Any:
    text = resources.files("stoker.manifest").joinpath("schema.json").read_text("utf-8")
    return fastjsonschema.compile(json.loads(text))


_validate_schema = _load_validator()


def _schema_error(exc: fastjsonschema.JsonSchemaValueException, source: str) -> ManifestError:
    where = exc.name.removeprefix("data").lstrip(".") or "(document)"
    value = exc.value
    if isinstance(value, (dict, list)):
        value = f"<{type(value).__name__} of {len(value)} items>"
    return ManifestError(
        f"{source}: field {where!r} is invalid: {exc.message.replace('data', where, 1)} "
        f"(got {value!r}). Fix the field or re-create the dataset with `stoker shard`.",
        field=where,
    )


class Manifest:
    """A validated stoker/1 dataset description.

    Build one with :meth:`load` (from a dataset directory or URL), :meth:`from_dict`, or
    :meth:`create` (from the parts a sharder knows); each path validates fully, so a
    ``Manifest`` object is always consistent.
    """

    def __init__(self, doc: dict[str, Any], root: str | None = None) -> None:
        self._doc = doc
        self.root = root

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        *,
        schema: pa.Schema,
        shards: Sequence[ShardInfo],
        sources: Sequence[Mapping[str, Any]],
        options: Mapping[str, Any],
        stoker_version: str,
        kind: str = "arrow",
        compression: str = "none",
        classes: Sequence[str] | None = None,
        created: str | None = None,
    ) -> "Manifest":
        """Assemble, fingerprint and validate a manifest from its parts."""
        doc: dict[str, Any] = {
            "format": FORMAT,
            "kind": kind,
            "fingerprint": "0" * 32,
            "num_samples": int(sum(s.rows for s in shards)),
            "compression": compression,
            "schema": describe_schema(schema),
            "shards": [s.to_dict() for s in shards],
            "provenance": {"sources": [dict(s) for s in sources], "options": dict(options),
                           "stoker_version": stoker_version},
        }
        if classes is not None:
            doc["classes"] = list(classes)
        if created is not None:
            doc["created"] = created
        doc["fingerprint"] = compute_fingerprint(doc)
        return cls.from_dict(doc)

    @classmethod
    def from_dict(cls, doc: Any, root: str | None = None, source: str = "manifest") -> "Manifest":
        """Validate ``doc`` (parsed JSON) and wrap it; raises :class:`ManifestError`."""
        if not isinstance(doc, dict):
            raise ManifestError(f"{source}: expected a JSON object at the top level, got "
                                f"{type(doc).__name__}. Re-create the dataset with `stoker shard`.")
        fmt = doc.get("format")
        if fmt != FORMAT:
            raise ManifestError(
                f"{source}: field 'format' is {fmt!r}, but this stoker reads only {FORMAT!r}. "
                "Upgrade stoker or re-create the dataset with this version's `stoker shard`.",
                field="format")
        try:
            _validate_schema(doc)
        except fastjsonschema.JsonSchemaValueException as exc:
            raise _schema_error(exc, source) from None
        _check_consistency(doc, source)
        return cls(doc, root)

    @classmethod
    def load(cls, location: str | os.PathLike[str],
             storage_options: Mapping[str, Any] | None = None) -> "Manifest":
        """Read ``manifest.json`` from a dataset directory, a manifest file, or a URL."""
        loc = os.fspath(location)
        target = loc if loc.endswith(".json") else join_location(loc.rstrip("/") or "/", MANIFEST_NAME)
        root = target.rsplit("/", 1)[0] if "/" in target else "."
        shown = redact_url(target)
        try:
            data = _read_bytes(target, storage_options)
        except FileNotFoundError:
            raise ManifestError(f"{shown}: no manifest found. Point at a directory made by "
                                "`stoker shard` (it holds manifest.json).", field=None) from None
        except OSError as exc:
            raise ManifestError(f"{shown}: cannot read the manifest ({type(exc).__name__}: "
                                f"{exc.strerror or exc}). Check the path and permissions.") from None
        gc_was_enabled = gc.isenabled()
        gc.disable()  # 100k small dicts otherwise trigger repeated full collections
        try:
            doc = json.loads(data)
            return cls.from_dict(doc, root=root, source=shown)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ManifestError(f"{shown}: not valid JSON ({exc}); the file is empty, truncated "
                                "or not a manifest. Re-create it with `stoker shard`.") from None
        finally:
            if gc_was_enabled:
                gc.enable()

    # -- accessors ------------------------------------------------------------------------
    @property
    def fingerprint(self) -> str:
        return self._doc["fingerprint"]

    @property
    def kind(self) -> str:
        return self._doc["kind"]

    @property
    def num_samples(self) -> int:
        return self._doc["num_samples"]

    @property
    def compression(self) -> str:
        return self._doc["compression"]

    @property
    def fields(self) -> list[dict[str, Any]]:
        return self._doc["schema"]["fields"]

    @property
    def provenance(self) -> dict[str, Any]:
        return self._doc["provenance"]

    @property
    def classes(self) -> list[str] | None:
        return self._doc.get("classes")

    @property
    def num_shards(self) -> int:
        return len(self._doc["shards"])

    @cached_property
    def arrow_schema(self) -> pa.Schema:
        """The exact Arrow schema every shard has."""
        raw = base64.b64decode(self._doc["schema"]["arrow"])
        return pa.ipc.read_schema(pa.py_buffer(raw))

    @cached_property
    def shards(self) -> tuple[ShardInfo, ...]:
        return tuple(ShardInfo(s["path"], s["rows"], s["bytes"], s["xxh3_128"],
                               decode_runs(s["batches"]), s.get("extra", {}))
                     for s in self._doc["shards"])

    @cached_property
    def shard_rows(self) -> np.ndarray:
        """Rows per shard as int64, in manifest order."""
        return np.fromiter((s["rows"] for s in self._doc["shards"]), dtype=np.int64,
                           count=self.num_shards)

    @cached_property
    def shard_bytes(self) -> np.ndarray:
        return np.fromiter((s["bytes"] for s in self._doc["shards"]), dtype=np.int64,
                           count=self.num_shards)

    def shard_location(self, index: int) -> str:
        """Local path or URL of shard ``index``."""
        if self.root is None:
            raise ManifestError("this manifest was built in memory and has no dataset root; "
                                "load it with Manifest.load(path) to resolve shard locations.")
        return join_location(self.root, self._doc["shards"][index]["path"])

    def to_dict(self) -> dict[str, Any]:
        """A deep copy of the JSON document."""
        return json.loads(json.dumps(self._doc))

    def to_json(self) -> bytes:
        """The manifest file's exact bytes: sorted keys, one shard per line, trailing newline.

        Everything but the shard list is indented by one space; each shard is one compact
        line, which keeps a 100,000-shard manifest small and quick to parse but still
        readable and diff-able. ``"shards"`` sorts last among the top-level keys.
        """
        head = {k: v for k, v in self._doc.items() if k != "shards"}
        text = json.dumps(head, sort_keys=True, indent=1, ensure_ascii=True)
        lines = ",\n  ".join(json.dumps(s, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
                             for s in self._doc["shards"])
        shards = f'"shards": [\n  {lines}\n ]' if lines else '"shards": []'
        return f"{text[:-2]},\n {shards}\n}}\n".encode()

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write ``manifest.json`` atomically (temp file + fsync + rename) into ``directory``."""
        directory = Path(directory)
        target = directory / MANIFEST_NAME
        fd, tmp = tempfile.mkstemp(prefix=".manifest.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(self.to_json())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target

    def __repr__(self) -> str:
        return (f"Manifest(kind={self.kind!r}, samples={self.num_samples}, "
                f"shards={self.num_shards}, fingerprint={self.fingerprint!r})")


def compute_fingerprint(doc: Mapping[str, Any]) -> str:
    """xxh3-128 over the canonical JSON of the fields that define the data."""
    hashed = {k: v for k, v in doc.items() if k not in _UNHASHED_TOP}
    prov = doc.get("provenance")
    if isinstance(prov, Mapping):
        hashed["provenance"] = {k: v for k, v in prov.items() if k not in _UNHASHED_PROVENANCE}
    return hash_bytes(canonical_json(hashed))


def _check_consistency(doc: dict[str, Any], source: str) -> None:
    """The checks JSON Schema cannot express: sums, uniqueness, safe paths, fingerprint.

    Written to stay fast for 100,000 shards: a few microseconds of work per shard.
    """
    shards = doc["shards"]
    paths = [s["path"] for s in shards]
    check_shard_paths(paths)
    if len(set(paths)) != len(paths):
        seen: set[str] = set()
        for i, path in enumerate(paths):
            if path in seen:
                raise ManifestError(
                    f"{source}: field 'shards[{i}].path' repeats {path!r}; every shard path "
                    "must be unique. Remove the duplicate entry or re-create the dataset.",
                    field=f"shards[{i}].path")
            seen.add(path)
    total = 0
    for i, s in enumerate(shards):
        in_batches = sum(rows * repeat for rows, repeat in s["batches"])
        if in_batches != s["rows"]:
            raise ManifestError(
                f"{source}: field 'shards[{i}].batches' adds up to {in_batches} rows but "
                f"'shards[{i}].rows' is {s['rows']}; the two must agree. Re-create the dataset.",
                field=f"shards[{i}].batches")
        total += s["rows"]
    if total != doc["num_samples"]:
        raise ManifestError(
            f"{source}: field 'num_samples' is {doc['num_samples']} but the shards hold {total} "
            "rows; the counts must add up. Re-create the dataset with `stoker shard`.",
            field="num_samples")
    expected = compute_fingerprint(doc)
    if doc["fingerprint"] != expected:
        raise ManifestError(
            f"{source}: field 'fingerprint' is {doc['fingerprint']!r} but the content hashes to "
            f"{expected!r}; the manifest was edited or damaged after it was written. "
            "Re-create it with `stoker shard` (or restore the original).", field="fingerprint")


def _read_bytes(location: str, storage_options: Mapping[str, Any] | None) -> bytes:
    if is_url(location) and not location.startswith("file://"):
        return read_remote(location, redact_url(location), storage_options)
    path = location.removeprefix("file://")
    return Path(path).read_bytes()
