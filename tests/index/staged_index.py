"""An indexed Parquet dataset whose columns are all records: shuffled reads are staged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stoker.tools.cli import main

FEATS, CATS = ["f0", "f1", "f2"], ["c0"]


@pytest.fixture()
def indexed(tmp_path: Path) -> Path:
    """Two files, 130 and 90 rows, row groups of 40 (7 groups), indexed in place."""
    rng = np.random.default_rng(3)
    root = tmp_path / "data"
    root.mkdir()
    for name, rows in (("a.parquet", 130), ("b.parquet", 90)):
        cols: dict[str, Any] = {f: rng.random(rows, dtype=np.float32) for f in FEATS}
        cols["f1"][::7] = np.nan  # NaNs compare by their bytes
        cols["c0"] = rng.integers(-9, 9, rows)
        cols["seq"] = pa.FixedSizeListArray.from_arrays(
            pa.array(rng.random(rows * 4, dtype=np.float32)), 4).cast(pa.list_(pa.float32()))
        cols["label"] = rng.integers(0, 2, rows)
        pq.write_table(pa.table(cols), root / name, row_group_size=40)
    assert main(["index", str(root), "--quiet"]) == 0
    return root
