"""Suite-wide settings: ``tests/support`` (helpers several test folders share) is importable,
and row-major record files go to a per-run temporary directory.

Without the second, every DataLoader a test builds would keep its records under the user's
``~/.cache/stoker/row-major`` (the default, see stoker.loader.record_store); tests that check
the store itself pass their own directory.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

_RECORDS = tempfile.mkdtemp(prefix="stoker-test-row-major-")
os.environ["STOKER_ROW_MAJOR_DIR"] = _RECORDS  # subprocesses started by tests inherit it


@pytest.fixture(scope="session", autouse=True)
def _row_major_dir() -> Iterator[str]:
    yield _RECORDS
    shutil.rmtree(_RECORDS, ignore_errors=True)
