"""Manifest format stoker/1: round trips, fingerprints, and every kind of bad manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from stoker.manifest import Manifest, ManifestError, ShardInfo, compute_fingerprint

SCHEMA = pa.schema([("x", pa.float32()), ("label", pa.int64())])


def _manifest(n_shards: int = 3, **kw) -> Manifest:
    shards = [ShardInfo(f"shards/{i:05d}.arrow", 10 + i, 1000 + i, f"{i:032x}", (5, 5 + i))
              for i in range(n_shards)]
    return Manifest.create(schema=SCHEMA, shards=shards, sources=[], options={"rows": 10},
                           stoker_version="0.1.0", **kw)


def _write(tmp_path: Path, doc) -> Path:
    (tmp_path / "manifest.json").write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return tmp_path


def test_round_trip_preserves_everything(tmp_path: Path) -> None:
    m = _manifest()
    m.save(tmp_path)
    loaded = Manifest.load(tmp_path)
    assert loaded.to_dict() == m.to_dict()
    assert loaded.arrow_schema.equals(SCHEMA)
    assert loaded.shard_rows.tolist() == [10, 11, 12]
    assert loaded.num_samples == 33
    assert loaded.shard_location(1) == f"{tmp_path}/shards/00001.arrow"


def test_fingerprint_ignores_time_and_version_but_not_data() -> None:
    a = _manifest(created="2026-01-01T00:00:00Z")
    b = Manifest.create(schema=SCHEMA, shards=_manifest().shards, sources=[],
                        options={"rows": 10}, stoker_version="9.9", created="2030-01-01")
    assert a.fingerprint == b.fingerprint
    c = Manifest.create(schema=SCHEMA, shards=_manifest().shards, sources=[],
                        options={"rows": 11}, stoker_version="0.1.0")
    assert c.fingerprint != a.fingerprint
    d = Manifest.create(schema=pa.schema([("x", pa.float64()), ("label", pa.int64())]),
                        shards=_manifest().shards, sources=[], options={"rows": 10},
                        stoker_version="0.1.0")
    assert d.fingerprint != a.fingerprint


def test_saved_bytes_are_deterministic(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _manifest().save(tmp_path / "a")
    _manifest().save(tmp_path / "b")
    assert (tmp_path / "a/manifest.json").read_bytes() == (tmp_path / "b/manifest.json").read_bytes()


def _refit(doc: dict) -> dict:
    doc["fingerprint"] = compute_fingerprint(doc)
    return doc


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d["shards"][1].update(path="../evil.arrow"), "shards[1].path"),
        (lambda d: d["shards"][1].update(path="/etc/passwd"), "shards[1].path"),
        (lambda d: d["shards"][1].update(path="s3://bucket/x.arrow"), "shards[1].path"),
        (lambda d: d["shards"][1].update(path="shards/../../x"), "shards[1].path"),
        (lambda d: d["shards"][2].update(path=d["shards"][0]["path"]), "shards[2].path"),
        (lambda d: d.update(num_samples=34), "num_samples"),
        (lambda d: d["shards"][0].update(rows=11), "shards[0].batches"),
        (lambda d: d["shards"][0].update(rows=-1), "shards[0].rows"),
        (lambda d: d["shards"][0].pop("xxh3_128"), "shards[0]"),
        (lambda d: d.update(compression="lz4"), "compression"),
    ],
)
def test_bad_fields_name_the_field(tmp_path: Path, mutate, field: str) -> None:
    doc = _manifest().to_dict()
    mutate(doc)
    _write(tmp_path, _refit(doc))
    with pytest.raises(ManifestError) as info:
        Manifest.load(tmp_path)
    assert info.value.field == field
    assert field.split(".")[-1].split("[")[0] in str(info.value)


def test_edited_manifest_fails_fingerprint_check(tmp_path: Path) -> None:
    doc = _manifest().to_dict()
    doc["shards"][0]["bytes"] += 1
    _write(tmp_path, doc)
    with pytest.raises(ManifestError, match="fingerprint"):
        Manifest.load(tmp_path)


@pytest.mark.parametrize("text", ["", "{", "[]", "null", '{"format": "stoker/0"}', "\x00\x01"])
def test_unreadable_manifest(tmp_path: Path, text: str) -> None:
    _write(tmp_path, text)
    with pytest.raises(ManifestError):
        Manifest.load(tmp_path)


def test_wrong_version_names_the_version(tmp_path: Path) -> None:
    doc = _manifest().to_dict()
    doc["format"] = "stoker/2"
    _write(tmp_path, doc)
    with pytest.raises(ManifestError, match="stoker/2"):
        Manifest.load(tmp_path)


def test_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no manifest found"):
        Manifest.load(tmp_path / "nowhere")


def test_batches_are_run_length_encoded_and_empty_manifests_work(tmp_path: Path) -> None:
    from stoker.manifest.manifest import decode_runs, encode_runs

    for rows in [(), (5,), (4, 4, 4, 1), (1, 2, 2, 1, 1)]:
        assert decode_runs(encode_runs(rows)) == rows
    assert encode_runs((4, 4, 4, 1)) == [[4, 3], [1, 1]]
    empty = Manifest.create(schema=SCHEMA, shards=[], sources=[], options={}, stoker_version="0")
    empty.save(tmp_path)
    assert Manifest.load(tmp_path).num_samples == 0
    assert json.loads((tmp_path / "manifest.json").read_text()) == empty.to_dict()


def test_one_shard_per_line(tmp_path: Path) -> None:
    _manifest(n_shards=4).save(tmp_path)
    lines = (tmp_path / "manifest.json").read_text().splitlines()
    assert sum(1 for line in lines if line.lstrip().startswith('{"batches"')) == 4
