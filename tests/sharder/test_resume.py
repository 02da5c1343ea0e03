"""Resume: an interrupted run continues where it stopped and ends byte-identical."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from stoker.sharder import SharderError, shard
from stoker.sharder import sharding as shard_module
from stoker.sharder.build import BUILD_DIR
from stoker.sharder.synthetic import make_tabular_table, write_tabular_parquet

_STOKER = [sys.executable, "-m", "stoker.tools"]


def _mtimes(dst: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in (dst / "shards").glob("*.arrow")}


def test_failed_run_resumes_and_skips_verified_shards(tmp_path: Path, monkeypatch, tree_bytes
                                                      ) -> None:
    src = tmp_path / "in.parquet"
    pq.write_table(make_tabular_table(6000, seed=5), src)
    shard(src, tmp_path / "ref", rows_per_shard=1000)
    real = shard_module.run_task

    def flaky(task):
        if getattr(task, "path", "").endswith("00004.arrow"):
            raise SharderError("injected failure")
        return real(task)

    monkeypatch.setattr(shard_module, "run_task", flaky)
    dst = tmp_path / "out"
    with pytest.raises(SharderError, match="injected"):
        shard(src, dst, rows_per_shard=1000)
    monkeypatch.undo()
    assert not (dst / "manifest.json").exists() and (dst / BUILD_DIR / "plan.json").exists()
    before = _mtimes(dst)
    assert sorted(before) == [f"{i:05d}.arrow" for i in range(4)]
    # A damaged finished shard is rewritten, the intact ones are kept as they are.
    (dst / "shards/00001.arrow").write_bytes(b"damaged")
    # Temp files of killed writers (ours and Manifest.save's) do not block the resume.
    (dst / "shards/.00004.arrow.1234abcd.stoker-tmp").write_bytes(b"partial")
    (dst / ".manifest.x1y2.tmp").write_bytes(b"{")
    time.sleep(0.01)
    shard(src, dst, rows_per_shard=1000)
    after = _mtimes(dst)
    assert {k: after[k] for k in ("00000.arrow", "00002.arrow", "00003.arrow")} == \
        {k: before[k] for k in ("00000.arrow", "00002.arrow", "00003.arrow")}
    assert after["00001.arrow"] != before["00001.arrow"]
    assert tree_bytes(dst) == tree_bytes(tmp_path / "ref")


def test_changed_options_restart_the_build(tmp_path: Path, monkeypatch, tree_bytes) -> None:
    src = tmp_path / "in.parquet"
    pq.write_table(make_tabular_table(3000, seed=5), src)

    def fail(task):
        raise SharderError("injected failure")

    monkeypatch.setattr(shard_module, "run_task", fail)
    with pytest.raises(SharderError):
        shard(src, tmp_path / "out", rows_per_shard=500)
    monkeypatch.undo()
    shard(src, tmp_path / "out", rows_per_shard=1000)
    shard(src, tmp_path / "ref", rows_per_shard=1000)
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "ref")


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_sigkill_mid_run_then_rerun_is_byte_identical(tmp_path: Path, tree_bytes,
                                                      workers: int) -> None:
    src = tmp_path / "in.parquet"
    write_tabular_parquet(src, 120_000, seed=9, row_group_rows=10_000)
    args = ["--rows-per-shard", "2500", "--workers", str(workers), "--quiet"]
    dst = tmp_path / "out"
    proc = subprocess.Popen(_STOKER + ["shard", str(src), str(dst), *args],
                            start_new_session=True, stderr=subprocess.PIPE)
    done = dst / BUILD_DIR / "done"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if done.is_dir() and len([p for p in done.iterdir() if p.name.startswith("shard")]) >= 3:
            break
        time.sleep(0.005)
    assert proc.poll() is None, f"finished before it could be killed: {proc.stderr.read()}"
    os.killpg(proc.pid, signal.SIGKILL)  # the whole group: the CLI and its pool workers
    proc.wait()
    proc.stderr.close()
    assert not (dst / "manifest.json").exists()
    finished = len(list(done.glob("shard-*")))
    assert 3 <= finished < 48
    rerun = subprocess.run(_STOKER + ["shard", str(src), str(dst), *args], capture_output=True,
                           text=True)
    assert rerun.returncode == 0, rerun.stderr
    assert sorted(os.listdir(dst)) == ["manifest.json", "shards"]
    ref = subprocess.run(_STOKER + ["shard", str(src), str(tmp_path / "ref"), *args],
                         capture_output=True)
    assert ref.returncode == 0
    assert tree_bytes(dst) == tree_bytes(tmp_path / "ref")
