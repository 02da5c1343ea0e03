"""Fixtures for fast-path tests (builders live in fastpath_helpers)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for fastpath_helpers (importlib mode)

from fastpath_helpers import mixed_table, write_dataset  # noqa: E402


@pytest.fixture(scope="session")
def mixed_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fast_mixed")
    sizes = [23, 40, 17, 31]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    write_dataset(root, [mixed_table(n, int(s), i) for i, (n, s) in enumerate(zip(sizes, starts))])
    return root
