"""Accelerate and Lightning recognise stoker's loader and keep its order (issue 18): CPU,
1 and 2 processes (gloo), the real packages. Each rank's samples are disjoint, the ranks take
the same step count and together read every sample once per epoch, and set_epoch reaches
the loader. On main (5871c69) the 2-process Lightning run hung (ranks resolved different
world sizes) and Accelerate left the loader unrecognised."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from frameworks_data import check

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str], tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [1, 2])
def test_accelerate_prepare_keeps_stokers_loader(world: int, tmp_path: Path) -> None:
    out = tmp_path / "out"
    script = str(HERE / "train_accelerate.py")
    if world == 1:
        _run([sys.executable, script, str(out)], tmp_path)
    else:
        _run([str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
              "--master-port", str(_free_port()), script, str(out)], tmp_path)
    check(out, world)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [1, 2])
def test_lightning_fit_keeps_stokers_loader_and_order(world: int, tmp_path: Path) -> None:
    out = tmp_path / "out"
    _run([sys.executable, str(HERE / "train_lightning.py"), str(out), str(world)], tmp_path)
    for run in check(out, world):
        assert run["loader"] == "stoker.loader.dataloader.DataLoader"
        assert run["sampler"] == "OrderSampler"  # not replaced by a DistributedSampler
