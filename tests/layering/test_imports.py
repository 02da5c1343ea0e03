"""Data flows one way (DESIGN.md): ``sharder -> manifest <- cache <- loader``.

Checked on the source text with :mod:`ast`, so an import hidden inside a function (the lazy
kind that slips through an import-time check) counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# package folder -> stoker packages its modules must never import (tools sits on top of all);
# a sub-folder's entry adds to its parent's: fetching knows nothing of the store it fills, a
# source reader nothing of the plan that calls it
FORBIDDEN = {
    "cache": ("stoker.loader", "stoker.sharder", "stoker.tools", "stoker.serve"),
    "cache/fetch": ("stoker.cache.store", "stoker.cache.dataset"),
    "loader": ("stoker.sharder", "stoker.tools", "stoker.serve"),
    "manifest": ("stoker.cache", "stoker.loader", "stoker.sharder", "stoker.tools",
                 "stoker.serve"),
    "serve": ("stoker.sharder", "stoker.tools"),
    "sharder": ("stoker.cache", "stoker.loader", "stoker.tools", "stoker.serve"),
    "sharder/sources": ("stoker.sharder.assemble", "stoker.sharder.build",
                        "stoker.sharder.executor", "stoker.sharder.index", "stoker.sharder.plan",
                        "stoker.sharder.sharding", "stoker.sharder.writer"),
}


def imported_modules(source: str) -> set[str]:
    """Every module ``source`` imports: ``import a.b``, ``from a import b`` (as ``a`` and
    ``a.b``), relative imports resolved against nothing (kept with their dots), and
    ``importlib.import_module("a.b")`` / ``__import__("a.b")`` with a literal name."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            arg = node.args[0]
            if name in ("import_module", "__import__") and isinstance(arg, ast.Constant) \
                    and isinstance(arg.value, str):
                found.add(arg.value)
    return found


def violations(source: str, forbidden: tuple[str, ...]) -> list[str]:
    """The imports of ``source`` that are, or are inside, a ``forbidden`` package."""
    return sorted(m for m in imported_modules(source)
                  if any(m == f or m.startswith(f + ".") for f in forbidden))


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_no_package_imports_against_the_data_flow(folder: str) -> None:
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files, f"no sources under {ROOT / folder}"
    bad = {str(p.relative_to(ROOT)): v for p in files
           if (v := violations(p.read_text(encoding="utf-8"), FORBIDDEN[folder]))}
    assert bad == {}


def test_no_relative_imports_that_would_hide_a_crossing() -> None:
    # relative imports cannot leave their package here, but they would dodge the check above
    # if a folder were ever nested; STYLE.md asks for absolute imports anyway
    for folder in FORBIDDEN:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = [m for m in imported_modules(path.read_text(encoding="utf-8"))
                   if m.startswith(".")]
            assert rel == [], path


@pytest.mark.parametrize("source", [
    "import stoker.sharder",
    "import stoker.sharder.sources.webdataset as w",
    "from stoker.sharder.sources.webdataset import parse_members",
    "from stoker import sharder",
    "def f():\n    from stoker.sharder import shard\n",
    "import importlib\nimportlib.import_module('stoker.sharder.sources.tar_layout')",
])
def test_the_scan_sees_every_form_of_import(source: str) -> None:
    assert violations(source, ("stoker.sharder",))


@pytest.mark.parametrize("source", [
    "import stoker.sharderx",
    "from stoker.manifest import Manifest",
    "x = 'stoker.sharder'",
])
def test_the_scan_does_not_flag_other_names(source: str) -> None:
    assert violations(source, ("stoker.sharder",)) == []


# loader's sub-packages, bottom up: jit <- order <- fastpath <- read <- DataLoader (the
# modules directly in loader/ and service/); workers and ledger beside. A sub-package may
# import the ones below it and the shared leaves loader.errors and loader.fallbacks.
_LOADER_TOP = ("dataloader", "distributed", "epoch_iter", "iterable", "loader_state", "sources",
               "loader_world", "run_ledger", "samplers", "state", "stats", "transfer")
_ABOVE = {
    "jit": ("order", "fastpath", "read", "workers", "ledger", "service", "options"),
    "order": ("fastpath", "read", "workers", "ledger", "service", "options"),
    "fastpath": ("read", "workers", "ledger", "service", "options"),
    "workers": ("fastpath", "read", "ledger", "service", "options"),
    "ledger": ("jit", "order", "fastpath", "read", "workers", "service", "options"),
    "read": ("ledger", "service", "options"),
    # the DataLoader's option objects: checked with order's and fastpath's own rules
    "options": ("read", "workers", "ledger"),
}
LOADER_FORBIDDEN = {pkg: tuple(f"stoker.loader.{m}" for m in (*above, *_LOADER_TOP))
                    + (("torch",) if pkg == "order" else ())
                    for pkg, above in _ABOVE.items()}


@pytest.mark.parametrize("package", sorted(LOADER_FORBIDDEN))
def test_loader_sub_packages_import_only_downwards(package: str) -> None:
    files = sorted((ROOT / "loader" / package).rglob("*.py"))
    assert files, f"no sources under loader/{package}"
    bad = {str(p.relative_to(ROOT)): v for p in files
           if (v := violations(p.read_text(encoding="utf-8"), LOADER_FORBIDDEN[package]))}
    assert bad == {}


def test_no_library_folder_holds_more_than_15_modules() -> None:
    for folder in ("loader", "cache", "sharder", "tools", "manifest", "serve",
                   *(str(p.relative_to(ROOT)) for p in (ROOT / "loader").iterdir()
                     if (p / "__init__.py").exists())):
        assert len(list((ROOT / folder).glob("*.py"))) <= 15, folder
