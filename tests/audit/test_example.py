"""examples/reproducible_training.py runs: two runs, two crashes, audits pass, identical losses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "reproducible_training.py"


def test_reproducible_training_example(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), "--workdir", str(tmp_path), "--rows", "3000"],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "bitwise identical" in out.stdout
    assert out.stdout.count("result: REPRODUCIBLE") == 3
    assert "2 resume(s) at" in out.stdout and "each continued exactly" in out.stdout
    assert (tmp_path / "audit-a-vs-b.html").stat().st_size > 10_000
