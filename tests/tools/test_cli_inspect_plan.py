"""``stoker inspect DST --plan``: the loader's order options and working set, as the loader has
them; bad options exit 2, options the node cannot hold exit 1, one clean line each. The
ledger's header records the same working set."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from stoker.loader import DataLoader, ShuffleOptions
from stoker.loader.ledger.reader import read_ledger
from stoker.sharder import shard
from stoker.sharder.synthetic import make_tabular_table
from stoker.tools.cli import main


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("plan")
    pq.write_table(make_tabular_table(6000, seed=3), root / "in.parquet", row_group_size=1000)
    shard(str(root / "in.parquet"), str(root / "ds"), rows_per_shard=1000, progress=False)
    return root / "ds"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv,kw", [
    ([], dict(batch_size=256, shuffle=True)),
    (["--batch-size", "32", "--world-size", "4", "--partitions", "24", "--block-size", "64"],
     dict(batch_size=32, world_size=4, rank=0,
          shuffle=ShuffleOptions(partitions=24, block_size=64))),
    (["--no-shuffle", "--num-workers", "2"], dict(batch_size=256, shuffle=False, num_workers=2)),
])
def test_plan_is_the_loaders(dataset: Path, capsys, argv: list[str], kw: dict) -> None:
    code, out, _ = _run(capsys, "inspect", str(dataset), "--plan", "--json", *argv)
    assert code == 0
    info = json.loads(out)
    dl = DataLoader(str(dataset), **kw)
    assert info["order"] == dl.order_options.to_dict()
    assert info["working_set"] == dl.working_set.to_dict()
    assert info["steps_per_epoch"] == len(dl)
    assert info["shuffled_reads"] == (None if kw["shuffle"] is False else "per-shard records")
    dl.close()
    code, text, _ = _run(capsys, "inspect", str(dataset), "--plan", *argv)
    assert code == 0 and f"{info['working_set']['shards']:,} shards live" in text


def test_plan_errors_are_one_line(dataset: Path, capsys) -> None:
    code, _, err = _run(capsys, "inspect", str(dataset), "--plan", "--partitions", "7",
                        "--world-size", "2")
    assert code == 2 and "Traceback" not in err and "must divide partitions=7" in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1


def test_the_ledger_header_records_the_working_set(dataset: Path, tmp_path: Path) -> None:
    dl = DataLoader(str(dataset), batch_size=64, shuffle=True, ledger=str(tmp_path / "a.ledger"))
    for _ in dl:
        pass
    want = dl.working_set.to_dict()
    dl.close()
    assert read_ledger(tmp_path / "a.ledger").header["working_set"] == want
