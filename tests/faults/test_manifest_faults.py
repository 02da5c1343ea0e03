"""Case 3 of issue 8: a broken manifest is a ManifestError within 1 s, before any worker starts.

Each kind of damage is one trial (9 in CI and in the report). Edits to the JSON keep the
fingerprint consistent, so the check that fires is the one for the damage, not the fingerprint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import psutil
import pytest
from fault_helpers import Figures, Stopwatch, make_dataset

from stoker.loader import DataLoader, WorkerOptions
from stoker.manifest import ManifestError
from stoker.manifest.manifest import compute_fingerprint


def _edit(fn: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        doc = json.loads((root / "manifest.json").read_text())
        fn(doc)
        doc["fingerprint"] = compute_fingerprint(doc)
        (root / "manifest.json").write_text(json.dumps(doc))
    return apply


def _raw(text: Callable[[str], str]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        path = root / "manifest.json"
        path.write_text(text(path.read_text()))
    return apply


def _shard_file(root: Path) -> None:
    path = root / "shards" / "00001.arrow"
    path.write_bytes(path.read_bytes()[:-7])  # the file is shorter than the manifest says


DAMAGE = {
    "empty": _raw(lambda t: ""),
    "truncated": _raw(lambda t: t[: len(t) // 2]),
    "wrong version": _edit(lambda d: d.__setitem__("format", "stoker/99")),
    "duplicate shard paths": _edit(lambda d: d["shards"][1].__setitem__("path", d["shards"][0]["path"])),
    "sample count mismatch": _edit(lambda d: d.__setitem__("num_samples", d["num_samples"] + 1)),
    "shard size mismatch": _shard_file,
    "path traversal": _edit(lambda d: d["shards"][0].__setitem__("path", "../../etc/passwd")),
    "absolute path": _edit(lambda d: d["shards"][0].__setitem__("path", "/etc/passwd")),
    "not a manifest": _raw(lambda t: "[1, 2, 3]"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_broken_manifest_fails_at_construction(damage: str, tmp_path: Path, after_trial) -> None:
    figures = Figures("3 broken manifest")  # one trial per damage; the report adds them up
    figures.start()
    make_dataset(tmp_path, [30, 40, 50])
    DAMAGE[damage](tmp_path)
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    with Stopwatch() as sw, pytest.raises(ManifestError) as info:
        dl = DataLoader(tmp_path, batch_size=4, num_workers=2,
                        workers=WorkerOptions(mode="process"))
        dl.close()
    assert {p.pid for p in me.children(recursive=True)} == before  # no worker started
    assert str(info.value)  # a message, not an empty error
    after_trial()
    figures.trial(sw.s)
