"""Default locations (stoker.manifest.locations): the explicit argument, then ``STOKER_*``
environment variables, then the platform cache directory; derived data follows the node cache
directory, and the old entry points resolve through the same module."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from stoker.cache import default_cache_dir
from stoker.loader.fastpath.record_store import default_dir
from stoker.loader.jit import kernel
from stoker.manifest import locations


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No STOKER_* variable set (the suite sets STOKER_ROW_MAJOR_DIR), ``$XDG_CACHE_HOME`` and
    ``$HOME`` inside ``tmp_path``."""
    for name in (locations.ENV_CACHE_DIR, locations.ENV_RECORDS_DIR):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


def test_platform_root_is_xdg_cache_home_else_dot_cache(env: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    assert locations.platform_cache_root() == str(tmp_path / "xdg")
    env.setenv("XDG_CACHE_HOME", "")  # empty: unset, as the XDG spec says
    assert locations.platform_cache_root() == str(tmp_path / "home" / ".cache")


@pytest.mark.parametrize("explicit, env_value, expected", [
    ("/x/explicit", "/x/env", "/x/explicit"),      # explicit beats the environment
    (Path("/x/path"), "/x/env", "/x/path"),        # path-like, as a str
    (None, "/x/env", "/x/env"),                    # environment beats the platform
    (None, "", "{xdg}/stoker"),                    # empty counts as unset
    (None, None, "{xdg}/stoker"),                  # the platform cache directory
])
def test_cache_dir_resolution_order(env: pytest.MonkeyPatch, tmp_path: Path, explicit,
                                    env_value, expected) -> None:
    if env_value is not None:
        env.setenv("STOKER_CACHE_DIR", env_value)
    want = expected.format(xdg=tmp_path / "xdg")
    assert locations.cache_dir(explicit) == want
    if explicit is None:
        assert default_cache_dir() == want  # stoker.cache's name for it


@pytest.mark.parametrize("explicit, records_env, cache, cache_env, expected", [
    ("/r/explicit", "/r/env", "/c", "/c/env", "/r/explicit"),   # explicit first
    (None, "/r/env", "/c", "/c/env", "/r/env"),                 # then STOKER_ROW_MAJOR_DIR
    (None, "", "/c", "/c/env", None),                           # empty: memory only
    (None, None, "/c", "/c/env", "/c/row-major"),               # beside the dataset's cache
    (None, None, None, "/c/env", "/c/env/row-major"),           # STOKER_CACHE_DIR moves them
    (None, None, "", "/c/env", "/c/env/row-major"),             # an empty cache dir is none
    (None, None, None, None, "{xdg}/stoker/row-major"),         # the platform cache
])
def test_records_dir_resolution_order(env: pytest.MonkeyPatch, tmp_path: Path, explicit,
                                      records_env, cache, cache_env, expected) -> None:
    if records_env is not None:
        env.setenv("STOKER_ROW_MAJOR_DIR", records_env)
    if cache_env is not None:
        env.setenv("STOKER_CACHE_DIR", cache_env)
    want = None if expected is None else expected.format(xdg=tmp_path / "xdg")
    assert locations.records_dir(explicit, cache) == want
    if explicit is None:
        assert default_dir(cache) == want  # the record store's name for it


def test_numba_fallbacks_follow_the_node_cache_dir(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    uid = os.getuid() if hasattr(os, "getuid") else 0
    temp = os.path.join(tempfile.gettempdir(), f"stoker-numba-{uid}")
    assert locations.numba_cache_fallbacks() == [str(tmp_path / "xdg" / "stoker" / "numba"), temp]
    env.setenv("STOKER_CACHE_DIR", str(tmp_path / "node"))
    assert locations.numba_cache_fallbacks() == [str(tmp_path / "node" / "numba"), temp]
    assert kernel._fallback_dirs() == locations.numba_cache_fallbacks()


def test_numba_cache_dir_keeps_its_precedence(tmp_path: Path) -> None:
    """A writable NUMBA_CACHE_DIR is left alone; an unwritable one falls back to the first
    writable of stoker's locations (the fallback logic is unchanged)."""
    fallbacks = [str(tmp_path / "node" / "numba")]
    assert kernel.choose_cache_dir(str(tmp_path / "mine"), [], fallbacks) == (None, None)
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file: no directory can be made there
    chosen, warning = kernel.choose_cache_dir(str(blocked / "sub"), [], fallbacks)
    assert chosen == fallbacks[0] and warning is not None and "NUMBA_CACHE_DIR" in warning
