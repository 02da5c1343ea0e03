"""Kernels import and cache even where Numba's default cache locations are not writable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from stoker.loader.order.feistel import feistel_py
from stoker.loader.jit.kernel import choose_cache_dir


def _unwritable(tmp_path: Path, name: str) -> str:
    """A directory path that cannot be created, even by root: its parent is a regular file."""
    blocker = tmp_path / f"{name}-file"
    blocker.write_text("not a directory")
    return str(blocker / "dir")


def test_choose_cache_dir_prefers_what_works(tmp_path: Path) -> None:
    good, bad = str(tmp_path / "good"), _unwritable(tmp_path, "bad")
    fallback = str(tmp_path / "fallback")
    assert choose_cache_dir(good, [bad], [fallback]) == (None, None)
    assert choose_cache_dir(None, [bad, good], [fallback]) == (None, None)
    assert choose_cache_dir("", [bad, bad], [bad, fallback]) == (fallback, None)
    chosen, warning = choose_cache_dir(bad, [good], [_unwritable(tmp_path, "x"), fallback])
    assert chosen == fallback and f"NUMBA_CACHE_DIR={bad!r} is not a writable" in warning
    chosen, warning = choose_cache_dir(bad, [bad], [bad])
    assert chosen == "" and "compiled on every run" in warning
    chosen, warning = choose_cache_dir(None, [bad], [bad])
    assert chosen == "" and "Set NUMBA_CACHE_DIR to a writable directory" in warning


def test_unwritable_cache_dir_falls_back_with_a_warning(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "NUMBA_CACHE_DIR": _unwritable(tmp_path, "numba"),
           "HOME": _unwritable(tmp_path, "home"), "XDG_CACHE_HOME": _unwritable(tmp_path, "xdg"),
           "TMPDIR": str(tmp)}
    code = ("import os, warnings, numpy as np\n"
            "warnings.simplefilter('always')\n"
            "from stoker.loader.order import feistel\n"
            "print(feistel.feistel(np.int64(3), np.int64(1000), 10, np.uint64(5)))\n"
            "print(os.environ['NUMBA_CACHE_DIR'])\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    value, cache_dir = out.stdout.split()
    assert int(value) == feistel_py(3, 1000, 5)
    assert cache_dir == str(tmp / f"stoker-numba-{os.getuid()}")
    assert "KernelCacheWarning" in out.stderr and "is not a writable directory" in out.stderr
    assert any(p.suffix == ".nbi" for p in Path(cache_dir).rglob("*"))
