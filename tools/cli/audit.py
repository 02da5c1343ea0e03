"""``stoker audit RUN [RUN2]``: prove a run's data order; exit 0 reproducible, 1 not, 2 usage."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "audit", help="check a run's ledger: replay, coverage, resumes, comparison, stalls",
        description="Audit the ledger(s) of a training run written with "
                    "DataLoader(ledger=...). Exit code 0 when the run is reproducible, 1 when a "
                    "check fails, 2 on bad usage.")
    p.add_argument("run", help="a ledger file, or a directory of per-rank *.ledger files")
    p.add_argument("run2", nargs="?", help="a second run to compare with")
    p.add_argument("-o", "--output", metavar="REPORT.html", help="write the HTML report here")
    p.add_argument("--json", metavar="OUT.json", help="write the JSON report here")
    p.add_argument("--dataset", metavar="PATH",
                   help="where the dataset lives now, if not where the ledger says")
    p.add_argument("--sample", type=_fraction, default=1.0, metavar="FRACTION",
                   help="rebuild and compare the delivered content of this share of the steps "
                        "(e.g. 0.01 for very long runs; default 1: every step)")
    p.add_argument("--no-verify", action="store_true",
                   help="do not re-hash the dataset's shards")
    p.add_argument("-q", "--quiet", action="store_true", help="no terminal summary")
    return p


def run(args: argparse.Namespace) -> int:
    from stoker.tools.audit import audit
    from stoker.tools.audit.html import render_html
    from stoker.tools.audit.report import terminal_summary

    report = audit(args.run, args.run2, dataset=args.dataset, verify=not args.no_verify,
                   sample=args.sample)
    if args.output:
        _write(args.output, render_html(report))
    if args.json:
        _write(args.json, report.to_json())
    if not args.quiet:
        print(terminal_summary(report))
    return report.exit_code


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"--sample {text!r}: give a fraction in (0, 1], "
                                         "e.g. 0.01")
    return value


def _write(path: str, text: str) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
