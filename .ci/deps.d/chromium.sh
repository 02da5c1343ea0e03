#!/usr/bin/env bash
# Headless Chromium (Debian package `chromium`) for the audit report test
# (tests/audit/test_report_html.py); installed quietly, only when missing.
set -euo pipefail
command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium)
