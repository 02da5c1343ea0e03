"""The distribution installs one namespace, ``stoker``, with absolute imports only."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest


def test_bare_folder_imports_fail() -> None:
    for name in ("loader", "manifest", "sharder", "cache", "tools"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(name)


def test_public_api_imports() -> None:
    from stoker.manifest import Manifest  # noqa: F401

    assert importlib.import_module("stoker.manifest").__all__


def test_console_script_version() -> None:
    from stoker.manifest import stoker_version

    out = subprocess.run([sys.executable, "-m", "stoker.tools", "--version"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"stoker {stoker_version()}"
    assert stoker_version() != "0+unknown"
