"""Mixture tests: shared helpers importable (pytest runs in importlib mode), small sources."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for blend_model, mixture_helpers
SERVERS = Path(__file__).resolve().parents[1] / "servers"
if str(SERVERS) not in sys.path:
    sys.path.insert(0, str(SERVERS))

from mixture_helpers import make_source  # noqa: E402
from server_fixtures import nginx  # noqa: E402,F401 - the shared loopback HTTP server


@pytest.fixture(scope="session")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three sources of 97, 40 and 13 samples in uneven shards (small ones repeat often)."""
    root = tmp_path_factory.mktemp("mix")
    make_source(root / "web", [20, 31, 17, 29], salt=0)
    make_source(root / "code", [16, 24], salt=1)
    make_source(root / "books", [6, 7], salt=2)
    return {name: root / name for name in ("web", "code", "books")}
