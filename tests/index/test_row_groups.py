"""The decoded row groups an indexed Parquet epoch keeps (stoker.loader.read.index_staging.RowGroups):
past its budget it drops groups so that neither access pattern of the staged order decodes
a group again and again: every round of a small dataset at many partitions reads every
group in ascending order (a cycle), a large dataset's rounds slide over the groups."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from stoker.loader.read.index_staging import RowGroups

ROWS = 100


def _groups(budget_groups: float) -> tuple[RowGroups, list[tuple[int, int]]]:
    reads: list[tuple[int, int]] = []

    def read(file: int, group: int) -> pa.Table:
        reads.append((file, group))
        return pa.table({"x": np.full(ROWS, file * 1000 + group, dtype=np.int64)})

    one = pa.table({"x": np.zeros(ROWS, dtype=np.int64)}).nbytes
    groups = RowGroups(read, lambda f: np.full(4, ROWS), ["x"], lambda b: None,
                       int(budget_groups * one))
    return groups, reads


def _round(groups: RowGroups, keys: list[tuple[int, int]]) -> None:
    for file, group in keys:  # a round asks for its groups file by file, in ascending order
        data = groups._group(file, group)
        int64 = data.views[4]
        assert int(int64[data.meta["x"][0, 2] // 8]) == file * 1000 + group


ALL = [(f, g) for f in range(3) for g in range(4)]  # 12 groups


@pytest.mark.parametrize("kept", [10.5, 11.5])
def test_a_cycle_over_more_groups_than_fit_misses_only_what_does_not_fit(kept: float) -> None:
    groups, reads = _groups(kept)
    for _ in range(9):
        _round(groups, ALL)
    missing = len(ALL) - int(kept)
    # plain LRU decodes all 12 groups in every round (108); dropping the group read last in
    # this round keeps the rest for the next: ``missing`` decodes per later round
    assert len(reads) == len(ALL) + 8 * missing


def test_a_sliding_window_decodes_each_group_once() -> None:
    groups, reads = _groups(4.5)
    for r in range(len(ALL) - 2):
        _round(groups, ALL[r:r + 3])  # the cursors' groups: three at a time, moving on
    assert reads == ALL
