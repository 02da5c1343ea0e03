"""docs/API.md: every public name of stoker.loader and stoker.cache is documented there, and
its examples run (in order, as one session, in a fresh interpreter in an empty directory)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import stoker.cache
import stoker.loader

DOC = Path(__file__).resolve().parents[1] / "docs" / "API.md"


def _blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.M | re.S)


def test_every_public_loader_and_cache_name_is_documented() -> None:
    text = DOC.read_text(encoding="utf-8")
    names = set(stoker.loader.__all__) | set(stoker.cache.__all__) - {"parse_size",
                                                                       "default_cache_dir"}
    missing = sorted(n for n in names if not re.search(rf"`[^`\n]*\b{n}\b[^`\n]*`", text))
    assert missing == []


def test_the_examples_run(tmp_path: Path) -> None:
    blocks = _blocks()
    assert len(blocks) >= 15
    script = "\n\n".join(f"# --- block {i}\n{b}" for i, b in enumerate(blocks))
    (tmp_path / "api_examples.py").write_text(script, encoding="utf-8")
    out = subprocess.run([sys.executable, "api_examples.py"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
