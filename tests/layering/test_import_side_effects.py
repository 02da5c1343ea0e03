"""Importing stoker.loader (and its DataLoader) starts no thread and compiles nothing."""

from __future__ import annotations

import subprocess
import sys

_CODE = """
import threading, sys
import torch
before = threading.active_count()
from stoker.loader import DataLoader
from stoker.loader.read.arrow import ArrowSource
threads = threading.active_count() - before, [t.name for t in threading.enumerate()][1:]
from stoker.loader.fastpath import kernels
from stoker.loader.order import feistel
compiled = [d.__name__ for d in (kernels.gather_fixed, kernels.gather_list, feistel.order_range)
            if d.signatures]
print(threads[0], compiled, threads[1])
"""


def test_importing_the_loader_starts_no_thread() -> None:
    out = subprocess.run([sys.executable, "-c", _CODE], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    extra, compiled, names = out.stdout.split(" ", 2)
    assert int(extra) == 0, names
    assert compiled == "[]"
