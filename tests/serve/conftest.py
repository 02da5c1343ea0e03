"""Data-service tests: real ``stoker serve`` processes on loopback (tests/servers)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_data import image_dataset, w1_dataset  # noqa: E402
from stoker_server import StokerServer  # noqa: E402


@pytest.fixture(scope="module")
def w1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return w1_dataset(tmp_path_factory.mktemp("w1"))


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return image_dataset(tmp_path_factory.mktemp("images"))


@pytest.fixture(scope="module")
def two_servers(w1: Path, images: Path) -> Iterator[list[StokerServer]]:
    """Two servers, each serving both datasets (started once per module)."""
    servers = [StokerServer([w1, images]) for _ in range(2)]
    try:
        yield servers
    finally:
        for s in servers:
            s.stop()
