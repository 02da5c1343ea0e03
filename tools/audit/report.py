"""Audit results: one :class:`Check` per section, the verdict, JSON and the terminal summary."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["STATUSES", "AuditReport", "Check", "terminal_summary"]

STATUSES = ("pass", "fail", "warn", "skip", "info")
"""``fail`` makes the run not reproducible (exit 1); ``warn`` and ``skip`` are shown, not fatal."""


@dataclass(slots=True)
class Check:
    """One section of the audit.

    Attributes:
        name: section key (``"replay"``, ``"coverage"``, ...).
        status: one of :data:`STATUSES`.
        summary: one line for the terminal.
        details: JSON-plain facts behind the summary (shown in the HTML and JSON).
    """

    name: str
    status: str
    summary: str
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"check {self.name!r}: status {self.status!r} not in {STATUSES}")

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "summary": self.summary, "details": self.details}


@dataclass(slots=True)
class AuditReport:
    """Everything ``stoker audit`` found; ``series`` feeds the plots (not the verdict)."""

    runs: list[str]
    checks: list[Check]
    series: dict[str, Any] = field(default_factory=dict)

    @property
    def reproducible(self) -> bool:
        return not any(c.status == "fail" for c in self.checks)

    @property
    def exit_code(self) -> int:
        return 0 if self.reproducible else 1

    def check(self, name: str) -> Check:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"no check named {name!r}; have {[c.name for c in self.checks]}")

    def to_dict(self) -> dict[str, Any]:
        return {"format": "stoker-audit/1", "runs": self.runs, "reproducible": self.reproducible,
                "checks": {c.name: c.to_dict() for c in self.checks}}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True, default=str) + "\n"


_MARK = {"pass": "PASS", "fail": "FAIL", "warn": "WARN", "skip": "SKIP", "info": "INFO"}


def terminal_summary(report: AuditReport) -> str:
    """A few aligned lines: one per check, then the verdict."""
    lines = [f"stoker audit: {' vs '.join(report.runs)}"]
    for c in report.checks:
        lines.append(f"  {c.name:<11} {_MARK[c.status]:<5} {c.summary}")
    verdict = "REPRODUCIBLE" if report.reproducible else "NOT REPRODUCIBLE"
    failed = [c.name for c in report.checks if c.status == "fail"]
    lines.append(f"result: {verdict}" + (f" (failed: {', '.join(failed)})" if failed else ""))
    return "\n".join(lines)
