"""The Dask engine: byte-identical output to the local pool, on a LocalCluster and on a
scheduler + worker processes started on loopback; clear errors."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from source_fixtures import dataset_bytes, write_image_folder, write_tars

from stoker.sharder import SharderError, shard
from stoker.sharder.synthetic import write_tabular_parquet
from stoker.tools.cli import main

pytest.importorskip("distributed")
from stoker.sharder.executor_dask import DaskExecutor  # noqa: E402


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dask-src")
    (root / "pq").mkdir()
    write_tabular_parquet(root / "pq" / "a.parquet", 3000, seed=1, row_group_rows=700)
    write_tabular_parquet(root / "pq" / "b.parquet", 2000, seed=2, row_group_rows=900)
    write_tars(root / "tars", compress="gz")
    write_image_folder(root / "imgs")
    return {"parquet": root / "pq", "webdataset": root / "tars", "imagefolder": root / "imgs"}


@pytest.fixture(scope="module")
def reference(sources: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
              ) -> dict[str, dict[str, bytes]]:
    """Every source sharded by the local engine, one process."""
    root = tmp_path_factory.mktemp("dask-ref")
    return {name: (shard(src, root / name, rows_per_shard=_ROWS[name]),
                   dataset_bytes(root / name))[1] for name, src in sources.items()}


_ROWS = {"parquet": 900, "webdataset": 8, "imagefolder": 4}


def test_local_cluster_output_is_byte_identical(sources, reference, tmp_path: Path) -> None:
    executor = DaskExecutor(workers=2)
    for name, src in sources.items():
        shard(src, tmp_path / name, rows_per_shard=_ROWS[name], executor=executor)
        assert dataset_bytes(tmp_path / name) == reference[name], name


@pytest.mark.slow
def test_scheduler_and_worker_processes_byte_identical(sources, reference, dask_scheduler,
                                                      tmp_path: Path) -> None:
    executor = DaskExecutor(dask_scheduler)
    assert executor.workers == 2  # asked from the scheduler: sets the groups of a tar's shards
    for name, src in sources.items():
        shard(src, tmp_path / name, rows_per_shard=_ROWS[name], executor=executor)
        assert dataset_bytes(tmp_path / name) == reference[name], name


@pytest.mark.slow
def test_cli_engine_dask_with_scheduler(sources, reference, dask_scheduler, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli"
    assert main(["shard", str(sources["webdataset"]), str(out), "--rows-per-shard", "8",
                 "--engine", "dask", "--scheduler", dask_scheduler]) == 0
    assert dataset_bytes(out) == reference["webdataset"]
    assert "fingerprint" in capsys.readouterr().err


def test_failing_task_is_reraised(dask_scheduler) -> None:
    executor = DaskExecutor(dask_scheduler)
    with pytest.raises(ValueError, match="math domain error"):
        list(executor.map(math.sqrt, [4.0, -1.0, 9.0]))
    assert sorted(executor.map(math.sqrt, [4.0, 9.0])) == [2.0, 3.0]


def test_bad_arguments_and_unreachable_scheduler(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="scheduler='localhost'"):
        DaskExecutor("localhost")
    with pytest.raises(ValueError, match="workers=0"):
        DaskExecutor(workers=0)
    assert main(["shard", str(tmp_path), str(tmp_path / "o"), "--scheduler", "tcp://x:1"]) == 2


def test_missing_dask_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)
    with pytest.raises(SharderError, match=r"pip install 'stoker\[dask\]'"):
        DaskExecutor()
