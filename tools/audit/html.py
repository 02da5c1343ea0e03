"""The audit report as one self-contained HTML file: inline CSS and SVG, no script, no network."""

from __future__ import annotations

import json
from html import escape
from typing import Any

from stoker.tools.audit.mixture import shares_chart
from stoker.tools.audit.report import AuditReport, Check
from stoker.tools.audit.svg import line_chart

__all__ = ["render_html"]

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;
max-width:1000px;color:#222;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.verdict{display:inline-block;padding:4px 12px;border-radius:4px;color:#fff;font-weight:600}
.ok{background:#2e7d32}.bad{background:#c62828}
table{border-collapse:collapse;margin:6px 0;width:100%}td,th{border:1px solid #ddd;padding:4px 8px;
text-align:left;vertical-align:top}th{background:#f6f6f6}
.s{font-weight:700;font-family:ui-monospace,Menlo,Consolas,monospace}
.pass{color:#2e7d32}.fail{color:#c62828}.warn{color:#ef6c00}.skip,.info{color:#555}
code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
pre{background:#f6f6f6;padding:8px;overflow:auto;max-height:320px}
svg .t{font-size:13px;font-weight:600}svg .k{font-size:11px;fill:#444}
"""


def render_html(report: AuditReport) -> str:
    """The full report; every value is escaped, plots are inline SVG."""
    ok = report.reproducible
    parts = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
             "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">",
             f"<title>stoker audit: {escape(' vs '.join(report.runs))}</title>",
             f"<style>{_CSS}</style></head><body>",
             f"<h1>stoker audit</h1><p>{escape(' vs '.join(report.runs))}</p>",
             f"<p><span class=\"verdict {'ok' if ok else 'bad'}\">"
             f"{'REPRODUCIBLE' if ok else 'NOT REPRODUCIBLE'}</span></p>",
             "<table><tr><th>check</th><th>status</th><th>summary</th></tr>"]
    for c in report.checks:
        parts.append(f"<tr><td><a href=\"#{c.name}\">{c.name}</a></td>"
                     f"<td class=\"s {c.status}\">{c.status.upper()}</td>"
                     f"<td>{escape(c.summary)}</td></tr>")
    parts.append("</table>")
    parts.append("<h2 id=\"plots\">data stall and throughput</h2>")
    parts.append(_plots(report.series.get("stall", {})))
    if report.series.get("mixture"):  # a run over a mixture (stoker.tools.audit.mixture)
        parts.append("<h2 id=\"shares\">realised proportions</h2>")
        parts.append(shares_chart(report.series["mixture"]))
    for c in report.checks:
        parts.append(_section(c, report))
    parts.append("</body></html>\n")
    return "".join(parts)


def _section(c: Check, report: AuditReport) -> str:
    body = [f"<h2 id=\"{c.name}\">{c.name} <span class=\"s {c.status}\">{c.status.upper()}"
            f"</span></h2><p>{escape(c.summary)}</p>"]
    d = c.details
    if c.name == "identity":
        body.append(_kv({k: v for k, v in d.items() if k != "versions"}))
        body.append("<p>versions</p>" + _kv(d.get("versions", {})))
    elif c.name == "replay" and d.get("first_mismatch"):
        body.append("<p>first mismatch</p>" + _kv(d["first_mismatch"]))
    elif c.name == "content" and "steps_checked" in d:
        body.append(_kv({"steps recorded": d["steps_recorded"],
                         "steps checked": d["steps_checked"], "mismatches": d["mismatched"],
                         "sample": d["sample"], "shards verified": d["shards_verified"]}))
        if d.get("mismatches"):
            body.append("<p>mismatches (first 50)</p>" + _rows(
                d["mismatches"], ("epoch", "step", "rank", "column", "expected_digest",
                                  "delivered_digest", "file")))
    elif c.name in ("sources", "proportions") and d.get("sources"):
        body.append(_rows(d["sources"], ("source", "samples", "consumed", "passes_complete",
                                         "unproven", "target", "realised_share",
                                         "target_share", "deviation")))
    elif c.name == "coverage":
        body.append(_rows(d.get("epochs", []), ("epoch", "verdict", "steps", "covered_steps",
                                                "method", "missing_ranges", "duplicate_steps",
                                                "duplicate_ids", "missing_ids")))
    elif c.name == "resumes":
        body.append(_rows(d.get("resumes", []), ("file", "segment", "epoch", "step", "explicit",
                                                 "rolled_back_steps", "gap", "next_recorded",
                                                 "exact", "restart")))
    elif c.name == "comparison":
        body.append("<p>header differences (first, second)</p>"
                    + _kv(d.get("header_differences", {})))
        if d.get("first_divergence"):
            body.append("<p>first divergence</p>" + _kv(d["first_divergence"]))
    elif c.name == "stall":
        body.append("<p>plots: <a href=\"#plots\">data stall and throughput</a></p>" + _kv(d))
    elif c.name == "stream":
        if d.get("truncated"):
            cols = ("file", "at_byte", "size", "readable_steps")
            body.append("<p>truncated ledgers</p>" + _rows(d["truncated"], cols))
        if d.get("discontinuities"):
            body.append(_rows(d["discontinuities"][:50], ("file", "from", "to", "kind")))
    elif c.name == "events" and d.get("events"):
        body.append(_rows(d["events"][:50], ("file", "kind", "at", "time")))
    elif c.name == "integrity" and d.get("bad"):
        body.append(_rows(d["bad"], ("shard", "problem")))
    body.append("<details><summary>details (JSON)</summary><pre>"
                f"{escape(json.dumps(d, indent=1, default=str))}</pre></details>")
    return "".join(body)


def _plots(series: dict[str, Any]) -> str:
    ranks = series.get("ranks", [])
    stall = [(f"rank {r['rank']}", r["t"], [100 * v for v in r["stall"]]) for r in ranks]
    rate = [(f"rank {r['rank']}", r["t"], r["throughput"]) for r in ranks]
    return (line_chart("Data-stall timeline (share of time waiting for data)", stall,
                       "time (s)", "waiting (%)", y_max=100.0, css_class="plot stall-timeline")
            + line_chart("Throughput", rate, "time (s)", "samples / s",
                         css_class="plot throughput"))


def _cell(v: Any) -> str:
    if isinstance(v, (dict, list, tuple)):
        text = json.dumps(v, default=str)
        return f"<code>{escape(text if len(text) < 400 else text[:400] + ' ...')}</code>"
    return escape(str(v))


def _kv(d: dict[str, Any]) -> str:
    if not d:
        return "<p>none</p>"
    rows = "".join(f"<tr><th>{escape(str(k))}</th><td>{_cell(v)}</td></tr>" for k, v in d.items())
    return f"<table>{rows}</table>"


def _rows(items: list[dict[str, Any]], cols: tuple[str, ...]) -> str:
    if not items:
        return "<p>none</p>"
    head = "".join(f"<th>{c}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{_cell(i.get(c, ''))}</td>" for c in cols) + "</tr>"
                   for i in items)
    return f"<table><tr>{head}</tr>{body}</table>"
