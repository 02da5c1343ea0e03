"""Small stoker datasets for loader tests, built directly with pyarrow (no sharder needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for loader_helpers (importlib mode)

from loader_helpers import make_dataset  # noqa: E402


@pytest.fixture(scope="session")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """19 shards of 20-45 rows (615 samples): uneven, so tails and straddles are exercised."""
    root = tmp_path_factory.mktemp("ds")
    make_dataset(root, [20 + (7 * i) % 26 for i in range(19)])
    return root


@pytest.fixture(scope="session")
def other_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ds_other")
    make_dataset(root, [30, 30, 30])
    return root
