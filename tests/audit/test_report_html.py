"""The HTML report renders offline in headless Chromium, without console errors, with its plots."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from stoker.loader.ledger.writer import LedgerWriter
from stoker.tools.audit import audit
from stoker.tools.audit.html import render_html

CHROMIUM = shutil.which("chromium")


def _report(tmp_path: Path, dataset, kit) -> Path:
    m, loc = dataset
    for rank in (0, 1):
        head = kit.header(m, loc, world_size=2, rank=rank)
        with LedgerWriter(tmp_path / "runs/a.ledger", head) as w:
            kit.write_steps(w, m, head, kit.epoch_positions(head, range(2)))
    html = render_html(audit(tmp_path / "runs/a.ledger", tmp_path / "runs/a.ledger"))
    out = tmp_path / "report.html"
    out.write_text(html, encoding="utf-8")
    return out


def test_report_is_self_contained(tmp_path: Path, dataset, kit) -> None:
    html = _report(tmp_path, dataset, kit).read_text()
    assert "<script" not in html
    refs = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert refs and all(r.startswith("#") for r in refs), refs
    urls = set(re.findall(r"https?://[^\"' <]+", html))
    assert urls == {"http://www.w3.org/2000/svg"}  # the SVG namespace, never fetched
    assert html.count('<svg class="plot') == 2 and html.count("<polyline") == 4


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'chromium-profile'}",
         "--enable-logging=stderr", "--v=0", *args],
        capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (.ci/deps.d/chromium.sh)")
def test_report_renders_in_headless_chromium(tmp_path: Path, dataset, kit) -> None:
    report = _report(tmp_path, dataset, kit)
    url = report.as_uri()
    dom = _chromium(tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "REPRODUCIBLE" in dom.stdout
    assert re.search(r'<svg class="plot stall-timeline"[^>]*>.*?<polyline', dom.stdout, re.S)
    assert re.search(r'<svg class="plot throughput"[^>]*>.*?<polyline', dom.stdout, re.S)
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line
               or "Failed to load resource" in line]
    assert console == []
    shot = tmp_path / "report.png"
    run = _chromium(tmp_path, "--window-size=1100,2400", f"--screenshot={shot}", url)
    assert run.returncode == 0 and shot.stat().st_size > 20_000, run.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
