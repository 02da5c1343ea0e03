"""The shard/verify/inspect/demo commands: exit codes 0/1/2 and one clear line, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from stoker.sharder.synthetic import make_tabular_table
from stoker.tools.cli import main

_STOKER = Path(sys.executable).with_name("stoker")


@pytest.fixture()
def src(tmp_path: Path) -> Path:
    path = tmp_path / "in.parquet"
    pq.write_table(make_tabular_table(3000, seed=2), path, row_group_size=1000)
    return path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _one_clean_line(err: str, command: str) -> None:
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"stoker {command}: error: "), err


def test_shard_verify_inspect_happy_path(src: Path, tmp_path: Path, capsys) -> None:
    dst = tmp_path / "out"
    code, _, err = _run(capsys, "shard", str(src), str(dst), "--rows-per-shard", "1000",
                        "--compression", "zstd", "--columns", "f0,label")
    assert code == 0 and "3,000 rows in 3 shards" in err
    code, out, _ = _run(capsys, "verify", str(dst), "--quiet")
    assert code == 0 and "all 3 shards match" in out
    code, out, _ = _run(capsys, "inspect", str(dst), "--json")
    info = json.loads(out)
    assert code == 0
    assert (info["samples"], info["shards"], info["compression"]) == (3000, 3, "zstd")
    assert [f["name"] for f in info["schema"]] == ["f0", "label"]
    assert info["compression_ratio"] > 1.0  # labels 0/1 compress well
    code, out, _ = _run(capsys, "inspect", str(dst))
    assert code == 0 and info["fingerprint"] in out and "ratio" in out


def test_verify_lists_every_mismatch(src: Path, tmp_path: Path, capsys) -> None:
    dst = tmp_path / "out"
    assert _run(capsys, "shard", str(src), str(dst), "--rows-per-shard", "1000", "--quiet")[0] == 0
    data = bytearray((dst / "shards/00001.arrow").read_bytes())
    data[100] ^= 0xFF
    (dst / "shards/00001.arrow").write_bytes(bytes(data))
    (dst / "shards/00002.arrow").write_bytes(b"short")
    code, out, err = _run(capsys, "verify", str(dst), "--quiet")
    assert code == 1
    assert out.splitlines()[0].startswith("MISMATCH shards/00001.arrow: xxh3-128 ")
    listed = json.loads((dst / "manifest.json").read_text())["shards"][2]["bytes"]
    assert out.splitlines()[1] == \
        f"MISMATCH shards/00002.arrow: size 5 bytes, manifest says {listed}"
    assert "2 of 3 shards do not match" in err
    (dst / "shards/00000.arrow").unlink()
    code, out, _ = _run(capsys, "verify", str(dst), "--quiet")
    assert code == 1 and "MISMATCH shards/00000.arrow: missing" in out


@pytest.mark.parametrize(("argv", "code", "needle"), [
    (["shard", "{tmp}/missing.parquet", "{tmp}/out"], 1, "does not exist"),
    (["shard", "{src}", "{tmp}"], 1, "is inside DST"),
    (["shard", "{src}", "{tmp}/out", "--shard-size", "lots"], 2, "is not a byte size"),
    (["shard", "{src}", "{tmp}/out", "--rows-per-shard", "0"], 2, "must be a positive integer"),
    (["shard", "{src}", "{tmp}/out", "--workers", "0"], 2, "must be a positive integer"),
    (["shard", "{src}", "{tmp}/out", "--columns", "nope"], 1, "not in the inputs"),
    (["shard", "{src}"], 2, "at least one SRC and a DST"),
    (["verify", "{tmp}/nothing"], 1, "no manifest found"),
    (["inspect", "{tmp}/nothing"], 1, "no manifest found"),
    (["demo", "--rows", "0"], 2, "must be at least 1"),
])
def test_user_mistakes_get_one_line_and_an_exit_code(src: Path, tmp_path: Path, capsys,
                                                     argv: list[str], code: int,
                                                     needle: str) -> None:
    argv = [a.format(tmp=tmp_path, src=src) for a in argv]
    got, _, err = _run(capsys, *argv)
    assert got == code
    _one_clean_line(err, argv[0])
    assert needle in err


def test_both_size_options_is_usage_error(src: Path, tmp_path: Path, capsys) -> None:
    code, _, err = _run(capsys, "shard", str(src), str(tmp_path / "out"), "--shard-size", "1MB",
                        "--rows-per-shard", "5")
    assert code == 2 and "not allowed with argument" in err and "Traceback" not in err


def test_demo_runs_end_to_end(tmp_path: Path, capsys) -> None:
    code, out, _ = _run(capsys, "demo", "--rows", "5000", "--dir", str(tmp_path / "demo"),
                        "--workers", "1")
    assert code == 0
    assert "5,000 rows x 74 columns" in out and "verify" in out and "OK" in out
    assert "5,000 rows, shuffled" in out and "resume    exact" in out
    assert (tmp_path / "demo" / "stoker-demo-dataset" / "manifest.json").exists()


def test_console_script_subprocess(src: Path, tmp_path: Path) -> None:
    if not _STOKER.exists():
        pytest.skip(f"no console script beside {sys.executable}")
    dst = tmp_path / "out"
    ok = subprocess.run([str(_STOKER), "shard", str(src), str(dst), "--quiet"],
                        capture_output=True, text=True)
    assert (ok.returncode, ok.stderr) == (0, "")
    again = subprocess.run([str(_STOKER), "shard", str(src), str(dst)],
                           capture_output=True, text=True)
    assert again.returncode == 1 and "Traceback" not in again.stderr
    assert "already holds a complete stoker dataset" in again.stderr
    assert subprocess.run([str(_STOKER), "verify", str(dst)], capture_output=True).returncode == 0
