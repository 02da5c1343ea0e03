"""A records builder thread runs niced and with its disk reads in the idle I/O class, so a
node's first run past memory reads its rounds ahead of the build (shard_records.lower_priority).
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import threading

import pytest

from stoker.loader.fastpath import shard_records

_IOPRIO_GET = {"x86_64": 252, "aarch64": 31}.get(platform.machine()) \
    if sys.platform == "linux" else None


def _priorities_of_a_thread_that_lowered_itself() -> tuple[int, int]:
    got: dict[str, int] = {}

    def body() -> None:
        shard_records.lower_priority()
        tid = threading.get_native_id()
        libc = ctypes.CDLL(None, use_errno=True)
        got["io"] = libc.syscall(_IOPRIO_GET, 1, tid)
        got["nice"] = os.getpriority(os.PRIO_PROCESS, tid)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    return got["io"], got["nice"]


@pytest.mark.skipif(_IOPRIO_GET is None, reason="ioprio syscalls: Linux on x86_64/aarch64 only")
def test_a_builder_thread_reads_in_the_idle_io_class_and_runs_niced() -> None:
    io, nice = _priorities_of_a_thread_that_lowered_itself()
    assert io >> 13 == 3, f"I/O class {io >> 13} (priority value {io}), expected 3 (idle)"
    assert nice >= 10
    # the caller's own thread keeps its class: the advice is per thread
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.syscall(_IOPRIO_GET, 1, threading.get_native_id()) >> 13 != 3
