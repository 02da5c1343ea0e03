"""Mixture tests: make the shared helpers importable (pytest runs in importlib mode)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # for blend_model, mixture_helpers
