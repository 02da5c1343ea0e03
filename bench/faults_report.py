"""Run the fault-injection suite (tests/faults) at the issue's full trial counts; write figures.

Each case of issue 8 (and issue 14's cases 18-19) records (trials, failures, worst recovery
time, and for some cases further counts, e.g. how often the loader itself caught tampered
derived records) through
``tests/faults/fault_helpers.Figures`` into the JSON-lines file named by
``STOKER_FAULT_FIGURES``; ``STOKER_FAULT_TRIALS_SCALE`` raises every case's CI trial count
towards the issue's full count (``trials(ci, full)``). This script sets both, runs pytest on
the suite, and replaces the ``## Faults`` section of bench/RESULTS.md with the table.

    .venv/bin/python bench/faults_report.py             # full counts, writes RESULTS.md
    .venv/bin/python bench/faults_report.py --scale 1   # CI counts
    .venv/bin/python bench/faults_report.py --no-write  # print the table only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"
SECTION = "## Faults"


def run_suite(scale: float, extra: list[str]) -> tuple[int, list[dict], float]:
    """Run tests/faults with the scale; return (pytest status, figure rows, wall seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        figures = Path(tmp) / "figures.jsonl"
        env = dict(os.environ, STOKER_FAULT_TRIALS_SCALE=str(scale),
                   STOKER_FAULT_FIGURES=str(figures))
        pytest = Path(sys.executable).with_name("pytest")
        t0 = time.monotonic()
        status = subprocess.call([str(pytest), "-q", "-p", "no:cacheprovider", "-o",
                                  "timeout=3600", "tests/faults", *extra], cwd=ROOT, env=env)
        wall = time.monotonic() - t0
        rows = [json.loads(line) for line in figures.read_text().splitlines()] \
            if figures.exists() else []
    return status, rows, wall


def table(rows: list[dict]) -> str:
    """Trials (counted when each starts) and failures (trials that raised) per case, and the
    further counts some cases note (listed under the table)."""
    merged: dict[str, dict] = {}
    for r in rows:
        m = merged.setdefault(r["case"], {"trials": 0, "failures": 0, "worst": 0.0})
        m["trials"] += r["trials"]
        m["failures"] += r["failures"]
        m["worst"] = max(m["worst"], r["worst_recovery_s"])
        notes_of = m.setdefault("notes", {})
        for k, v in r.get("notes", {}).items():
            notes_of[k] = notes_of.get(k, 0) + v
    key = lambda name: (int(name.split()[0]), name)  # noqa: E731 - case number first
    lines = ["| case | trials | failures | worst recovery (s) |", "|---|---:|---:|---:|"]
    notes = []
    for name in sorted(merged, key=key):
        m = merged[name]
        lines.append(f"| {name} | {m['trials']} | {m['failures']} | {m['worst']:.3f} |")
        if m.get("notes"):
            notes.append(f"- {name}: " + ", ".join(f"{k} {v}" for k, v in m["notes"].items()))
    return "\n".join(lines + ([""] + notes if notes else []))


def write_section(body: str) -> None:
    text = RESULTS.read_text() if RESULTS.exists() else ""
    start = text.find(f"\n{SECTION}\n")
    block = f"\n{SECTION}\n\n{body}\n"
    if start < 0:
        text = text.rstrip("\n") + "\n" + block
    else:
        end = text.find("\n## ", start + len(SECTION) + 2)
        text = text[:start] + block + (text[end:] if end >= 0 else "")
    RESULTS.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1000.0,
                        help="multiplies CI trial counts (capped at the issue's full counts)")
    parser.add_argument("--no-write", action="store_true", help="print, do not edit RESULTS.md")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (e.g. -k ...)")
    args = parser.parse_args(argv)
    status, rows, wall = run_suite(args.scale, args.pytest_args)
    cpus = os.cpu_count()
    body = (f"`.venv/bin/python bench/faults_report.py --scale {args.scale:g}` on "
            f"{platform.machine()}, {cpus} CPUs, Python {platform.python_version()}: the "
            f"suite took {wall:.0f} s, pytest exit status {status} "
            f"({'all passed' if status == 0 else 'FAILURES: see the pytest output'}). "
            "A trial is counted when it starts and a failure when it raises, so failures show "
            "(a failed case still writes its row). Recovery = the time from the fault to the "
            "loader/cache being back (or the error raised); for case 16 it is one open/close "
            "cycle; for 18 and 19 the audit's run time.\n\n"
            + table(rows))
    print(body)
    if not args.no_write:
        write_section(body)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
