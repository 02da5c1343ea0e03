"""Index tests: builders from tests/sources/source_fixtures."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "sources"))  # source_fixtures
sys.path.insert(0, str(Path(__file__).parent))  # staged_index
