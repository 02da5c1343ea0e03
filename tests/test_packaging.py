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


def test_every_package_folder_is_in_the_distribution() -> None:
    """setuptools installs only the packages pyproject.toml lists: a sub-package missing there
    works in an editable checkout and is absent from the wheel."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"]
    listed = set(config["setuptools"]["packages"])
    folders = {name: Path(d) for name, d in config["setuptools"]["package-dir"].items()}
    found = {name + "".join("." + part for part in init.parent.relative_to(root / d).parts)
             for name, d in folders.items() for init in (root / d).rglob("__init__.py")}
    assert found == listed
