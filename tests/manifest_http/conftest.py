"""Fixtures for remote manifest reads: the shared loopback servers (tests/servers)."""

from __future__ import annotations

import sys
from pathlib import Path

SERVERS = Path(__file__).resolve().parents[1] / "servers"
if str(SERVERS) not in sys.path:
    sys.path.insert(0, str(SERVERS))

from server_fixtures import fault_server, nginx  # noqa: E402,F401 - shared fixtures
