"""Source tests: builders live in source_fixtures (shared with tests/dask and tests/index)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # for source_fixtures (importlib mode)
