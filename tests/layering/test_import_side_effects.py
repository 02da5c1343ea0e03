"""Importing stoker.loader (and its DataLoader) starts no thread, makes no Numba kernel (so
compiles nothing) and installs no hook (``atexit``, ``os.register_at_fork``); the warm-up's hooks
come with the first ``prime()`` (stoker.loader.fastpath.warm, or jit.warmup's Numba-only one),
once, and the kernels' at-fork hook with their making.

Each check runs in a fresh interpreter: the test process itself has long imported everything.
The libraries stoker builds on are imported before the counts are taken, so their own import
hooks (pyarrow.fs registers one at exit) are not charged to stoker.
"""

from __future__ import annotations

import atexit
import json
import subprocess
import sys

import pytest

# Records who registers a hook while stoker is imported: the module of the calling frame.
_PRELUDE = """
import atexit, json, os, sys, threading
import numba, numpy, pyarrow, pyarrow.fs, torch, xxhash

hooks = []

def _spy(register):
    def spy(*args, **kwargs):
        hooks.append(sys._getframe(1).f_globals.get("__name__", "?"))
        return register(*args, **kwargs)
    return spy

atexit.register = _spy(atexit.register)
os.register_at_fork = _spy(os.register_at_fork)
threads, exits = threading.active_count(), atexit._ncallbacks()
"""

_IMPORT = _PRELUDE + """
import stoker.loader
import stoker.loader.dataloader
from stoker.loader import DataLoader
from stoker.loader.read.arrow import ArrowSource
from stoker.loader.fastpath import kernels
from stoker.loader.jit.kernel import Lazy
from stoker.loader.order import feistel
# still stand-ins: no Numba dispatcher made, so nothing compiled (stoker.loader.jit.kernel)
made = [d.__name__ for d in (kernels.gather_fixed, kernels.gather_list, feistel.order_range)
        if not isinstance(d, Lazy)]
print(json.dumps({
    "threads": [t.name for t in threading.enumerate()][threads:],
    "made": made,
    "exit_hooks": atexit._ncallbacks() - exits,
    "stoker_hooks": [m for m in hooks if m.startswith("stoker")],
}))
"""

_PRIME = _PRELUDE + """
from stoker.loader.fastpath import warm
from stoker.loader.jit import warmup
at_import = (atexit._ncallbacks() - exits, list(hooks))
warm.prime()
warm.prime()
warmup.wait()
print(json.dumps({"at_import": at_import, "exit_hooks": atexit._ncallbacks() - exits,
                  "stoker_hooks": [m for m in hooks if m.startswith("stoker")]}))
"""


def _run(code: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


needs_cpython = pytest.mark.skipif(not hasattr(atexit, "_ncallbacks"),
                                   reason="atexit._ncallbacks is CPython's")


@needs_cpython
def test_importing_the_loader_starts_no_thread_and_installs_no_hook() -> None:
    seen = _run(_IMPORT)
    assert seen["threads"] == []
    assert seen["made"] == []
    assert seen["exit_hooks"] == 0
    assert seen["stoker_hooks"] == []


@needs_cpython
def test_the_first_prime_installs_the_warm_up_hooks_once() -> None:
    seen = _run(_PRIME)
    assert seen["at_import"] == [0, []]
    assert seen["exit_hooks"] == 1  # wait() at exit, registered once for three prime() calls
    # warm-up: at-fork and at-exit; the kernels' maker: at-fork (forks wait while it makes them),
    # and it makes them inside a fork-gate unit, whose first use installs the child's reset
    assert sorted(seen["stoker_hooks"]) == ["stoker.loader.jit.fork_gate",
                                            "stoker.loader.jit.kernel", "stoker.loader.jit.warmup",
                                            "stoker.loader.jit.warmup"]
