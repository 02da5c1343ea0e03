"""No silent fallback: a broad ``except`` in library code must re-raise or hand the error on.

Checked with :mod:`ast` over every module of the five packages. A handler is *broad* when it
catches ``Exception`` or ``BaseException`` (alone or in a tuple) or is a bare ``except:``; it
is allowed only when its body contains a ``raise`` (re-raise, or a typed error raised from
it), or when it binds the exception and passes it on as a value (``return Failure(exc)``,
``box.append((False, exc))``): a worker hands its error to the consumer that way. Handing it
to a logger, ``str`` or ``repr`` only is *not* passing it on. Narrow handlers (``except
OSError``) are fine: a named fallback catches what it expects and nothing else
(stoker.loader.fallbacks).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cache", "loader", "manifest", "sharder", "tools")
_BROAD = {"Exception", "BaseException"}
_NOT_PASSING_ON = {"debug", "info", "warning", "warn", "error", "exception", "critical", "log",
                   "str", "repr", "type", "format", "print"}


def _names(node: ast.expr | None) -> set[str]:
    if node is None:
        return {"<bare>"}
    items = node.elts if isinstance(node, ast.Tuple) else [node]
    return {i.id if isinstance(i, ast.Name) else i.attr if isinstance(i, ast.Attribute) else ""
            for i in items}


def _passes_on(handler: ast.ExceptHandler) -> bool:
    if handler.name is None:
        return False
    for node in ast.walk(ast.Module(body=handler.body, type_ignores=[])):
        if isinstance(node, ast.Call):
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if fname in _NOT_PASSING_ON:
                continue
            args = list(node.args) + [k.value for k in node.keywords]
            values = [e for a in args for e in ([a] + (a.elts if isinstance(a, ast.Tuple)
                                                         else []))]
            if any(isinstance(v, ast.Name) and v.id == handler.name for v in values):
                return True
    return False


def silent_handlers(source: str) -> list[int]:
    """Line numbers of broad handlers that neither raise nor pass the exception on."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ExceptHandler):
            continue
        if not (_names(node.type) & (_BROAD | {"<bare>"})):
            continue
        raises = any(isinstance(n, ast.Raise)
                     for n in ast.walk(ast.Module(body=node.body, type_ignores=[])))
        if not raises and not _passes_on(node):
            bad.append(node.lineno)
    return bad


@pytest.mark.parametrize("package", PACKAGES)
def test_library_code_has_no_silent_broad_except(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    found = {str(p.relative_to(ROOT)): lines for p in files
             if (lines := silent_handlers(p.read_text(encoding="utf-8")))}
    assert found == {}, "broad except without re-raise (name the fallback, narrow the types)"


@pytest.mark.parametrize("source", [
    "try:\n    f()\nexcept Exception:\n    pass\n",
    "try:\n    f()\nexcept:\n    pass\n",
    "try:\n    f()\nexcept BaseException as e:\n    log.warning('%s', e)\n",
    "try:\n    f()\nexcept (ValueError, Exception) as e:\n    x = str(e)\n",
    "try:\n    f()\nexcept Exception as e:\n    return None\n",
])
def test_the_scan_flags_silent_handlers(source: str) -> None:
    assert silent_handlers(source.replace("return None", "y = None")) != []


@pytest.mark.parametrize("source", [
    "try:\n    f()\nexcept Exception:\n    cleanup()\n    raise\n",
    "try:\n    f()\nexcept Exception as e:\n    raise TypedError(str(e)) from e\n",
    "try:\n    f()\nexcept BaseException as e:\n    box.append((False, e))\n",
    "try:\n    f()\nexcept OSError:\n    pass\n",
])
def test_the_scan_allows_raising_passing_on_and_narrow(source: str) -> None:
    assert silent_handlers(source) == []
