"""Wait until a stoker source reads with its compiled kernels."""

from __future__ import annotations

import time
from typing import Any

from stoker.loader.fastpath import warm

__all__ = ["kernels_ready"]


def kernels_ready(source: Any, timeout: float = 120.0) -> None:
    """Block until ``source`` (an ArrowSource) reads with its kernels. Groups of batches are
    read by them; while they compile (a cold Numba cache, as in CI) every batch is read on
    its own by their NumPy twins, so a test that asserts groups were used waits here first."""
    deadline = time.monotonic() + timeout
    while not warm.ready(*source._warm):
        assert time.monotonic() < deadline, f"the kernels were not ready after {timeout} s"
        time.sleep(0.02)
