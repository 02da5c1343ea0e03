"""bench/RESULTS.md: replace one ``## Title`` section (or append it), keeping the others."""

from __future__ import annotations

from pathlib import Path

__all__ = ["write_section"]

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def write_section(title: str, body: str, path: Path = RESULTS) -> None:
    """Put ``## {title}`` followed by ``body`` where that section is, or at the end."""
    doc = path.read_text() if path.exists() else "# Benchmark results\n"
    head = f"## {title}\n"
    section = f"{head}\n{body.strip()}\n"
    at = doc.find(head)
    if at < 0:
        doc = doc.rstrip("\n") + "\n\n" + section
    else:
        nxt = doc.find("\n## ", at + 1)
        doc = doc[:at] + section + (doc[nxt:] if nxt >= 0 else "")
    path.write_text(doc)
