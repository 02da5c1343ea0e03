"""Suite-wide settings: ``tests/support`` (helpers several test folders share) is importable,
row-major record files go to a per-run temporary directory, batches never take the cold-start
path by timing (``STOKER_COLD_START=wait``), and in CI a skip is a failure.

Without the second, every DataLoader a test builds would keep its records under the user's
``<node cache>/row-major`` (the default, see stoker.manifest.locations); tests that check
the store itself pass their own directory.

``STOKER_CI=1`` (set by ``.ci/run``): a test that would skip because a server, binary or
package is missing fails instead, naming what was missing; CI must run every test. Only
skips that need hardware CI does not have (CUDA) stay skips.
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
# Batches wait for the kernels instead of taking the pyarrow path while they compile
# (stoker.loader.fastpath.warm): which path served a batch must not depend on timing in a test.
# tests/fastpath/test_cold_start.py turns the fallback on where it is what is tested.
os.environ["STOKER_COLD_START"] = "wait"
# no kernels compiled ahead of time (stoker.loader.jit.aot), and no background build of them:
# tests/fastpath/test_aot.py turns them on in a directory of its own
os.environ["STOKER_AOT"] = "off"


@pytest.fixture(scope="session", autouse=True)
def _row_major_dir() -> Iterator[str]:
    yield _RECORDS
    shutil.rmtree(_RECORDS, ignore_errors=True)


_CI = os.environ.get("STOKER_CI") == "1"
_HARDWARE = ("CUDA", "GPU")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if not (_CI and report.skipped) or item.get_closest_marker("gpu") is not None:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if any(word in reason for word in _HARDWARE):
        return
    report.outcome = "failed"
    report.longrepr = (f"skipped in CI (STOKER_CI=1), where every test must run: {reason}. "
                      "Install what is missing (.ci/deps.d) instead of skipping.")
