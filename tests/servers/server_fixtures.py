"""pytest fixtures for the loopback servers, shared by tests/cache and tests/faults.

Import them into a conftest (``from server_fixtures import fault_server, nginx``) after
putting ``tests/servers`` on ``sys.path``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest

from fault_server import FaultServer
from nginx_server import NginxServer, nginx_binary

__all__ = ["fault_server", "nginx"]


@pytest.fixture
def fault_server() -> Iterator[FaultServer]:
    with FaultServer() as server:
        yield server


@pytest.fixture
def nginx() -> Iterator[Callable[[Path], NginxServer]]:
    """``nginx(root)`` starts nginx serving ``root``; stopped at teardown."""
    if nginx_binary() is None:
        pytest.skip("nginx binary not found; install the Debian package nginx "
                    "(.ci/deps.d/nginx.sh does it in CI)")
    started: list[NginxServer] = []

    def start(root: Path) -> NginxServer:
        server = NginxServer(root)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()
