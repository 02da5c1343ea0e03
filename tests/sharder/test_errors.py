"""Bad input gets one clear SharderError naming the thing and the fix, and loses nothing."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stoker.sharder import ShardOptionsError, SharderError, shard
from stoker.sharder import atomic
from stoker.sharder.synthetic import make_tabular_table


def _table(n: int = 20) -> pa.Table:
    return make_tabular_table(n, seed=1).select(["f0", "c0", "label"])


def _leftovers(dst: Path) -> list[str]:
    return sorted(p.name for p in dst.rglob("*") if p.name.endswith(atomic.TEMP_SUFFIX))


def test_missing_source(tmp_path: Path) -> None:
    with pytest.raises(SharderError, match=r"SRC '.*nope' does not exist"):
        shard(tmp_path / "nope", tmp_path / "out")
    with pytest.raises(SharderError, match="matches no file"):
        shard(str(tmp_path / "*.parquet"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_parquet_is_named(tmp_path: Path, damage: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(_table(), src / "a.parquet")
    good = (src / "a.parquet").read_bytes()
    (src / "b.parquet").write_bytes(b"not parquet at all" if damage == "garbage" else good[:-9])
    with pytest.raises(SharderError, match=r"cannot read '.*b\.parquet' as parquet"):
        shard(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("name", "data", "fmt"), [
    ("a.jsonl.zst", b"not a zstd frame", "jsonl"),
    ("a.jsonl", b'{"a": 1}\n{"a":\n', "jsonl"),
    ("a.csv", b"a,b\n1,2\n3\n", "csv"),
])
def test_corrupt_text_inputs_are_named(tmp_path: Path, name: str, data: bytes, fmt: str) -> None:
    (tmp_path / name).write_bytes(data)
    with pytest.raises(SharderError, match=rf"cannot read '.*{name}' as {fmt}"):
        shard(tmp_path / name, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_schema_mismatch_names_both_files_and_the_field(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(_table(), src / "a.parquet")
    pq.write_table(_table().set_column(1, "c0", pa.array([str(i) for i in range(20)])),
                   src / "b.parquet")
    with pytest.raises(SharderError, match=r"field 'c0' is int64 in '.*a\.parquet' but string "
                                           r"in '.*b\.parquet'"):
        shard(src, tmp_path / "out")
    pq.write_table(_table().drop_columns(["f0"]), src / "b.parquet")
    with pytest.raises(SharderError, match=r"field 'f0' is in '.*a\.parquet' but not in "
                                           r"'.*b\.parquet'"):
        shard(src, tmp_path / "out")


def test_zero_rows(tmp_path: Path) -> None:
    pq.write_table(_table(0), tmp_path / "empty.parquet")
    with pytest.raises(SharderError, match="hold 0 rows"):
        shard(tmp_path / "empty.parquet", tmp_path / "out")


def test_unknown_column(tmp_path: Path) -> None:
    pq.write_table(_table(), tmp_path / "a.parquet")
    with pytest.raises(SharderError, match=r"\['nope'\] not in the inputs; available"):
        shard(tmp_path / "a.parquet", tmp_path / "out", columns=["label", "nope"])


def test_dst_inside_src_and_src_inside_dst(tmp_path: Path) -> None:
    pq.write_table(_table(), tmp_path / "a.parquet")
    with pytest.raises(SharderError, match="is inside SRC"):
        shard(tmp_path, tmp_path / "out")
    with pytest.raises(SharderError, match="is inside DST"):
        shard(tmp_path / "a.parquet", tmp_path, overwrite=True)
    assert (tmp_path / "a.parquet").exists()


def test_unwritable_dst(tmp_path: Path) -> None:
    pq.write_table(_table(), tmp_path / "a.parquet")
    (tmp_path / "file").write_text("x")
    with pytest.raises(SharderError, match="is not writable"):
        shard(tmp_path / "a.parquet", tmp_path / "file" / "out")
    with pytest.raises(SharderError, match="exists and is not a directory"):
        shard(tmp_path / "a.parquet", tmp_path / "file")


def test_read_only_dst(tmp_path: Path) -> None:
    """Root ignores permission bits, so as root the parent is a read-only filesystem."""
    pq.write_table(_table(), tmp_path / "a.parquet")
    ro = tmp_path / "ro"
    mounted = os.geteuid() == 0 and _mount_tmpfs(ro, "1m", "ro")
    if not mounted:
        ro.mkdir(mode=0o555, exist_ok=True)
    try:
        with pytest.raises(SharderError, match="is not writable"):
            shard(tmp_path / "a.parquet", ro / "out")
    finally:
        if mounted:
            subprocess.run(["umount", str(ro)], check=False)


def test_non_empty_dst_and_finished_dataset_need_overwrite(tmp_path: Path) -> None:
    pq.write_table(_table(), tmp_path / "a.parquet")
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "precious.txt").write_text("keep me")
    with pytest.raises(SharderError, match="is not empty .*precious.txt.* not a stoker dataset"):
        shard(tmp_path / "a.parquet", dst)
    assert (dst / "precious.txt").read_text() == "keep me"
    shard(tmp_path / "a.parquet", dst, overwrite=True, rows_per_shard=7)
    assert sorted(p.name for p in dst.iterdir()) == ["manifest.json", "shards"]
    with pytest.raises(SharderError, match="already holds a complete stoker dataset"):
        shard(tmp_path / "a.parquet", dst)
    m = shard(tmp_path / "a.parquet", dst, overwrite=True, rows_per_shard=10)
    assert m.num_shards == 2 and len(list((dst / "shards").iterdir())) == 2


@pytest.mark.parametrize("kwargs", [
    {"rows_per_shard": 10, "shard_size": "1MB"}, {"rows_per_shard": 0},
    {"shard_size": "12 parsecs"}, {"shard_size": "0MB"}, {"compression": "lz4"},
    {"format": "xlsx"}, {"workers": 0}, {"columns": []}, {"columns": ["a", "a"]},
])
def test_bad_options(tmp_path: Path, kwargs: dict) -> None:
    pq.write_table(_table(), tmp_path / "a.parquet")
    with pytest.raises(ShardOptionsError):
        shard(tmp_path / "a.parquet", tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


class _FullDisk:
    """A file object that accepts ``budget`` more bytes (shared by all files), then ENOSPC."""

    budget = 0

    def __init__(self, raw) -> None:
        self._raw = raw

    def write(self, data) -> int:
        n = len(memoryview(data).cast("B"))
        if n > _FullDisk.budget:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        _FullDisk.budget -= n
        return self._raw.write(data)

    def __getattr__(self, name):
        return getattr(self._raw, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._raw.close()


def test_disk_full_cleans_up_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         tree_bytes) -> None:
    src = tmp_path / "in.parquet"
    pq.write_table(make_tabular_table(5000, seed=3), src)
    shard(src, tmp_path / "ref", rows_per_shard=1000)
    _FullDisk.budget = 1_000_000  # plan + first shards fit, then the disk is full
    monkeypatch.setattr(atomic, "_open", lambda path, mode: _FullDisk(open(path, mode)))
    dst = tmp_path / "out"
    with pytest.raises(SharderError, match="disk full while writing .*shards/0000"):
        shard(src, dst, rows_per_shard=1000)
    assert not (dst / "manifest.json").exists()
    assert _leftovers(dst) == []
    kept = sorted(p.name for p in (dst / "shards").iterdir())
    assert 0 < len(kept) < 5
    monkeypatch.undo()
    shard(src, dst, rows_per_shard=1000)
    assert tree_bytes(dst) == tree_bytes(tmp_path / "ref")


def _mount_tmpfs(path: Path, size: str, *flags: str) -> bool:
    path.mkdir()
    options = ",".join((f"size={size}", *flags))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True)
    return done.returncode == 0


def test_disk_full_on_a_real_tiny_filesystem(tmp_path: Path, tree_bytes) -> None:
    if os.geteuid() != 0 or not _mount_tmpfs(tmp_path / "tiny", "3m"):
        pytest.skip("needs root and tmpfs to make a small filesystem")
    try:
        src = tmp_path / "in.parquet"
        pq.write_table(make_tabular_table(20000, seed=3), src)  # ~8 MB of Arrow
        dst = tmp_path / "tiny" / "out"
        with pytest.raises(SharderError, match="disk full"):
            shard(src, dst, rows_per_shard=2000)
        assert not (dst / "manifest.json").exists()
        assert _leftovers(dst) == []
        subprocess.run(["mount", "-o", "remount,size=64m", str(tmp_path / "tiny")], check=True)
        shard(src, dst, rows_per_shard=2000)
        shard(src, tmp_path / "ref", rows_per_shard=2000)
        assert tree_bytes(dst) == tree_bytes(tmp_path / "ref")
    finally:
        subprocess.run(["umount", str(tmp_path / "tiny")], check=False)
