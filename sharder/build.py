"""The destination directory: what it holds now, and the build folder that makes runs resumable.

While a run is in progress ``DST/.stoker-build/`` holds ``plan.json`` (the plan and its hash)
and one small done-record per finished task. A rerun with the same plan keeps every shard
whose file still matches its record; a different plan starts over. Once ``manifest.json``
is written the build folder and any stray temp files are removed.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

from stoker.manifest import MANIFEST_NAME, canonical_json, hash_file
from stoker.sharder.atomic import TEMP_SUFFIX, write_bytes_atomic
from stoker.sharder.errors import SharderError
from stoker.sharder.plan import Plan
from stoker.sharder.writer import read_record

__all__ = ["BUILD_DIR", "Build", "check_destination", "clear_directory", "remove_temp_files"]

BUILD_DIR = ".stoker-build"
_log = logging.getLogger(__name__)


def check_destination(dst: Path, overwrite: bool) -> str:
    """Classify ``dst``: ``"new"``, ``"resume"`` or ``"replace"`` (needs ``overwrite``).

    Raises:
        SharderError: ``dst`` is a file, holds a finished dataset or foreign files, and
            ``overwrite`` is false.
    """
    if not dst.exists():
        return "new"
    if not dst.is_dir():
        raise SharderError(f"DST {str(dst)!r} exists and is not a directory; choose a directory.")
    try:
        entries = set(os.listdir(dst))
    except OSError as exc:
        raise SharderError(f"cannot list DST {str(dst)!r} ({exc.strerror}); check permissions."
                           ) from exc
    if not entries:
        return "new"
    if MANIFEST_NAME in entries:
        if not overwrite:
            raise SharderError(
                f"DST {str(dst)!r} already holds a complete stoker dataset (manifest.json); "
                "pass --overwrite to replace it, or choose another DST.")
        return "replace"
    if BUILD_DIR in entries and entries - {BUILD_DIR, "shards"} <= _temp_names(entries):
        return "resume"
    if not overwrite:
        shown = ", ".join(sorted(entries)[:3]) + (", ..." if len(entries) > 3 else "")
        raise SharderError(
            f"DST {str(dst)!r} is not empty ({shown}) and is not a stoker dataset; pass "
            "--overwrite to delete its contents, or choose an empty or new DST.")
    return "replace"


def _temp_names(names: set[str]) -> set[str]:
    """Our temp files, and those of ``Manifest.save`` (``.manifest.*.tmp``)."""
    return {n for n in names if n.endswith(TEMP_SUFFIX)
            or (n.startswith(".manifest.") and n.endswith(".tmp"))}


def clear_directory(path: Path) -> None:
    """Delete everything inside ``path`` (not ``path`` itself)."""
    for entry in sorted(os.listdir(path)):
        full = path / entry
        if full.is_dir() and not full.is_symlink():
            shutil.rmtree(full)
        else:
            full.unlink()


class Build:
    """The build folder of one run over ``plan`` into ``dst``."""

    def __init__(self, dst: Path, plan: Plan) -> None:
        self.dst = dst
        self.plan = plan
        self.dir = dst / BUILD_DIR

    def start(self) -> None:
        """Keep a build of the same plan; replace any other with a fresh one."""
        doc = read_record(self.dir / "plan.json")
        if doc is None or doc.get("plan_hash") != self.plan.plan_hash:
            if doc is not None:
                _log.warning("discarding an unfinished build in %s: it was made for other "
                             "inputs or options", self.dst)
            shutil.rmtree(self.dir, ignore_errors=True)
            shutil.rmtree(self.dst / "shards", ignore_errors=True)
        (self.dir / "done").mkdir(parents=True, exist_ok=True)
        (self.dst / "shards").mkdir(exist_ok=True)
        if doc is None or doc.get("plan_hash") != self.plan.plan_hash:
            body = {"plan_hash": self.plan.plan_hash, "plan": self.plan.to_dict()}
            write_bytes_atomic(self.dir / "plan.json", canonical_json(body))

    def shard_record(self, index: int) -> str:
        return str(self.dir / "done" / f"shard-{index:08d}.json")

    def source_record(self, index: int) -> str:
        return str(self.dir / "done" / f"source-{index:08d}.json")

    def finished(self) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]]]:
        """Done shards whose file still matches its record, and done source hashes."""
        shards, sources = {}, {}
        for i in range(self.plan.num_shards):
            rec = read_record(self.shard_record(i))
            if rec is not None and rec.get("path") == self.plan.shard_path(i) and self._intact(rec):
                shards[i] = rec
        for i in range(len(self.plan.inputs)):
            rec = read_record(self.source_record(i))
            if rec is not None and rec.get("path") == self.plan.inputs[i].rel:
                sources[i] = rec
        return shards, sources

    def _intact(self, rec: dict[str, Any]) -> bool:
        path = self.dst / rec["path"]
        try:
            if path.stat().st_size != rec["bytes"]:
                return False
            return hash_file(path)[0] == rec["xxh3_128"]
        except OSError:
            return False

    def finish(self) -> None:
        """Remove the build folder and stray temp files (after manifest.json is written)."""
        shutil.rmtree(self.dir, ignore_errors=True)
        remove_temp_files(self.dst)


def remove_temp_files(dst: Path) -> None:
    """Delete temp files a killed or failed writer left in ``dst`` and ``dst/shards``."""
    for folder in (dst, dst / "shards"):
        if folder.is_dir():
            for name in _temp_names(set(os.listdir(folder))):
                (folder / name).unlink(missing_ok=True)
