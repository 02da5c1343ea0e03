"""Hostile shard and member paths: refused component by component, wherever a path is used.

Each spelling goes through the rule itself, a whole manifest (fingerprint recomputed, so only
the path is wrong), ``stoker inspect`` (exit 1, the path named), and ``stoker export``'s tar
member names. Good paths, unusual ones included, still pass.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

from shard_writer import write_dataset  # noqa: E402

from stoker.manifest import (  # noqa: E402
    Manifest,
    ManifestError,
    check_relative_path,
    compute_fingerprint,
    path_problem,
)
from stoker.tools.cli import main  # noqa: E402
from stoker.tools.export import ExportError, export  # noqa: E402

HOSTILE = [
    "",                          # empty
    "/etc/passwd",               # absolute
    "../loot",                   # parent
    "shards/../../loot",         # parent, deeper
    "shards/..",                 # parent at the end
    "./shards/0.arrow",          # dot component
    "shards/./0.arrow",          # dot in the middle
    "shards//0.arrow",           # empty component
    "shards/",                   # trailing slash
    "x\n../outside/loot",        # newline: two "lines" for a multi-line pattern
    "x\r../loot",                # carriage return
    "a\tb",                      # tab
    "a\x00b",                    # NUL
    "a\x7fb",                    # DEL
    "shards\\..\\loot",          # backslashes
    "\\\\server\\share\\x",      # UNC
    "C:/Windows/x",              # drive letter
    "c:loot",                    # drive-relative
    "s3://bucket/loot",          # URL
    "file:///etc/passwd",        # file URL
    "...",                       # dots only
    "shards/. .",                # dots and spaces
    "shards/.. ",                # Windows strips the trailing space: ".."
    "shards/x.",                 # Windows strips the trailing dot
    "%2e%2e/loot",               # percent-encoded parent, decoded by HTTP servers
    "shards%2f..%2floot",        # percent-encoded slash
    "a%5c..%5cloot",             # percent-encoded backslash
    "\uff0e\uff0e/loot",         # fullwidth full stops: NFKC ".."
    "\u2025/loot",               # two-dot leader: NFKC ".."
    "shards\uff0f..\uff0floot",  # fullwidth solidus: NFKC "/"
    "a\u202eb",                  # right-to-left override
    "a\u2028b",                  # line separator
]

GOOD = ["shards/00000.arrow", "0.arrow", "a b/c d.arrow", ".hidden/x", "données/éé.arrow",
        "date=2024-01-01/part-0.parquet", "x..y/z", "a%20b/c", "~/x", "a/b:c"]


def test_there_are_enough_hostile_spellings() -> None:
    assert len(set(HOSTILE)) == len(HOSTILE) >= 20


@pytest.mark.parametrize("path", HOSTILE, ids=[repr(p) for p in HOSTILE])
def test_rule_refuses(path: str) -> None:
    assert path_problem(path) is not None
    with pytest.raises(ManifestError) as info:
        check_relative_path(path, "shards[3].path")
    assert "shards[3].path" in str(info.value) and repr(path) in str(info.value)


@pytest.mark.parametrize("path", GOOD)
def test_rule_accepts(path: str) -> None:
    assert path_problem(path) is None
    assert check_relative_path(path, "f") == path


def _dataset(root: Path, keys: list[str] | None = None) -> Manifest:
    n = 6
    cols = {"x": pa.array(np.arange(n, dtype=np.float32))}
    if keys is not None:
        cols = {"__key__": pa.array(keys), **cols}
    return write_dataset(root, [pa.table(cols)], batch_rows=3)


def _with_path(root: Path, path: str) -> Path:
    """The dataset's manifest with shard 0's path replaced and the fingerprint recomputed."""
    doc = json.loads((root / "manifest.json").read_text())
    doc["shards"][0]["path"] = path
    doc["fingerprint"] = compute_fingerprint(doc)
    (root / "manifest.json").write_text(json.dumps(doc))
    return root


@pytest.mark.parametrize("path", HOSTILE, ids=[repr(p) for p in HOSTILE])
def test_manifest_inspect_and_loader_refuse(tmp_path: Path, path: str, capsys) -> None:
    root = tmp_path / "data"
    _dataset(root)
    _with_path(root, path)
    with pytest.raises(ManifestError, match=r"shards\[0\]\.path"):
        Manifest.load(root)
    assert main(["inspect", str(root)]) == 1
    assert "shards[0].path" in capsys.readouterr().err
    from stoker.loader import DataLoader

    with pytest.raises(ManifestError):
        DataLoader(str(root), batch_size=2)


def test_symlink_out_of_the_dataset_is_refused_when_read(tmp_path: Path) -> None:
    root = tmp_path / "data"
    m = _dataset(root)
    outside = tmp_path / "outside.arrow"
    shard = root / m.shards[0].path
    os.replace(shard, outside)
    os.symlink(outside, shard)  # the manifest's path is plain; the file system escapes
    from stoker.loader import DataLoader

    dl = DataLoader(str(root), batch_size=2)
    try:
        with pytest.raises(ManifestError, match="outside the dataset directory"):
            next(iter(dl))
    finally:
        dl.close()
    with pytest.raises(ManifestError, match="outside the dataset directory"):
        export(root, tmp_path / "out", to="parquet")


@pytest.mark.parametrize("key", ["../../evil", "/abs/evil", "a/../../evil", "x\n../evil"])
def test_export_confines_tar_member_names(tmp_path: Path, key: str) -> None:
    root = tmp_path / "data"
    _dataset(root, keys=[key] + [f"k{i}" for i in range(1, 6)])
    with pytest.raises(ExportError, match="unpacking the tar could write outside"):
        export(root, tmp_path / "out", to="webdataset")
    assert not list((tmp_path / "out").glob("*.tar"))  # nothing half-written is left


def test_export_of_plain_keys_still_works(tmp_path: Path) -> None:
    import tarfile

    root = tmp_path / "data"
    _dataset(root, keys=[f"dir/k{i}" for i in range(6)])
    (tar,) = export(root, tmp_path / "out", to="webdataset")
    with tarfile.open(tar) as t:
        assert t.getnames() == [f"dir/k{i}.x" for i in range(6)]
