"""The framework smoke tests' shared helpers (``frameworks_data``) are importable."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
