"""The decoded row groups an indexed Parquet epoch keeps
(stoker.loader.read.indexed.row_groups.RowGroups): past its budget it drops groups so that neither access pattern of the staged order decodes
a group again and again: every round of a small dataset at many partitions reads every
group in ascending order (a cycle), a large dataset's rounds slide over the groups."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from stoker.loader.read.indexed.row_groups import RowGroups

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
    assert sorted(reads) == ALL  # each group decoded once (some by the decode-ahead thread)


def _layout_and_batch(kind: str, rows: int = 50) -> tuple[Any, pa.RecordBatch]:
    from stoker.loader.fastpath.plan import FastPlan
    from stoker.loader.fastpath.rowmajor import RecordLayout

    rng = np.random.default_rng(7)
    cols = {f"f{i}": pa.array(rng.random(rows, dtype=np.float32)) for i in range(3)}
    cols["c0"] = pa.array(rng.integers(-5, 5, rows))
    cols["seq"] = pa.FixedSizeListArray.from_arrays(
        pa.array(rng.random(rows * 4, dtype=np.float32)), 4).cast(pa.list_(pa.float32()))
    cols["label"] = pa.array(rng.integers(0, 2, rows))
    if kind == "null":
        cols["f1"] = pa.array(rng.random(rows, dtype=np.float32), mask=rng.random(rows) < 0.2)
    elif kind == "cast":  # int32 categoricals become int64: the kernels cast
        cols["c0"] = pa.array(rng.integers(-5, 5, rows).astype(np.int32))
    elif kind == "ragged":
        cols["seq"] = pa.array([[1.0] * (i % 3 + 3) for i in range(rows)], pa.list_(pa.float32()))
    elif kind == "dict":
        cols["c0"] = pa.array(rng.integers(0, 3, rows)).dictionary_encode()
    batch = pa.record_batch(cols)
    plan = FastPlan(batch.schema, ["seq", "label"], ["f0", "f1", "f2"], ["c0"])
    layout = RecordLayout.of(plan, [pa.record_batch({**cols, "seq": pa.FixedSizeListArray
                                     .from_arrays(pa.array(np.zeros(rows * 4, np.float32)), 4)
                                     .cast(pa.list_(pa.float32()))})])
    return layout, batch


@pytest.mark.parametrize("rows", [50, 20_250])  # one tile; 41 tiles, the last one partial
@pytest.mark.parametrize("transpose", ["kernel", "numpy"])  # compiled, or while it compiles
def test_plain_records_are_the_kernels_records(rows: int, transpose: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from stoker.loader.fastpath import rowmajor, warm
    from stoker.loader.fastpath.plan import ShardData

    from stoker.loader.read.indexed import row_groups
    from stoker.loader.read.indexed.row_groups import plain_records

    calls: list[int] = []
    kernel = row_groups._transpose
    monkeypatch.setattr(row_groups, "_transpose", lambda *a: calls.append(1) or kernel(*a))
    monkeypatch.setattr(warm, "usable", lambda fn: transpose == "kernel")
    layout, batch = _layout_and_batch("plain", rows)
    assert {f.name for f in layout.fields} == {"features", "categoricals", "seq", "label"}
    got = plain_records(batch, layout)
    assert got is not None
    assert len(calls) == (transpose == "kernel")
    want = rowmajor.build(layout, ShardData([batch], None, batch.schema.names))
    for f in layout.fields:  # the bytes of every field (padding between them is never read)
        np.testing.assert_array_equal(got[:, f.offset:f.offset + f.nbytes],
                                      want[:, f.offset:f.offset + f.nbytes], err_msg=f.name)
    got[3, layout.fields[0].offset] ^= 1  # and the comparison sees one flipped bit
    assert not np.array_equal(got[:, :layout.fields[0].nbytes], want[:, :layout.fields[0].nbytes])


@pytest.mark.parametrize("kind", ["null", "cast", "ragged", "dict"])
def test_what_is_not_plain_is_left_to_the_kernels(kind: str) -> None:
    from stoker.loader.read.indexed.row_groups import plain_records

    layout, batch = _layout_and_batch(kind)
    assert plain_records(batch, layout) is None


def test_the_next_group_is_decoded_ahead_and_its_errors_reach_the_reader() -> None:
    import threading

    from stoker.manifest import ShardIntegrityError

    threads: list[tuple[int, str]] = []

    def read(file: int, group: int) -> pa.Table:
        threads.append((group, threading.current_thread().name[:13]))
        if group == 3:
            raise ShardIntegrityError(f"file {file}: row group 3 changed")
        return pa.table({"x": np.full(ROWS, group, dtype=np.int64)})

    groups = RowGroups(read, lambda f: np.full(4, ROWS), ["x"], lambda b: None, 1 << 30)
    for g in range(3):
        groups._group(0, g)
        if g < 2:
            groups._ahead.wait((0, g + 1))  # the background thread's job, left to it
    with pytest.raises(ShardIntegrityError, match="row group 3 changed"):
        groups._ahead.wait((0, 3))  # failed ahead: its waiter gets the error
    with pytest.raises(ShardIntegrityError, match="row group 3 changed"):
        groups._group(0, 3)  # decoded again here: the reader that needs it gets it
    me = threading.current_thread().name[:13]
    assert threads == [(0, me), (1, "stoker-decode"), (2, "stoker-decode"),
                       (3, "stoker-decode"), (3, me)]
    assert groups.decoded == 3
    groups.close()


def test_a_round_decodes_every_group_it_reads_once_on_two_threads() -> None:
    """A round that reads from several row groups has them decoded at once: the background
    thread takes them in order while the round's thread, waiting for one, decodes the next
    queued itself; each group once, and every run gets its own group's rows."""
    import threading

    threads: dict[tuple[int, int], set[str]] = {}
    held = threading.Event()

    def read(file: int, group: int) -> pa.Table:
        threads.setdefault((file, group), set()).add(threading.current_thread().name)
        if group == 1:  # the background thread takes group 1 first and holds it
            held.wait(5)
        return pa.table({"x": np.arange(group * ROWS, (group + 1) * ROWS, dtype=np.int64)})

    groups = RowGroups(read, lambda f: np.full(4, ROWS), ["x"], lambda b: None, 1 << 30)
    first = np.array([1, ROWS + 2, 2 * ROWS + 3, 3 * ROWS + 4], dtype=np.int64)
    runs = groups.runs(0, first, first + 5, np.arange(4, dtype=np.int64) * 5)
    def reached(key: tuple[int, int]) -> None:
        for _ in range(500):
            if key in threads:
                return
            threading.Event().wait(0.01)

    got = [next(runs)]  # group 0, read here; groups 1-3 are queued
    reached((0, 1))  # the background thread takes group 1 (under load, not at once)
    rest = threading.Thread(target=lambda: got.extend(runs))
    rest.start()
    reached((0, 3))  # the round's thread decodes 2 and 3 while 1 is held
    held.set()
    rest.join(10)
    assert not rest.is_alive()
    assert len(threads[(0, 1)]) == 1 and next(iter(threads[(0, 1)])).startswith("stoker-decode")
    assert threads[(0, 0)] == {threading.current_thread().name}
    assert threads[(0, 2)] == threads[(0, 3)] == {rest.name}
    assert groups.decoded == 4
    for g, (data, lo, hi, dest) in enumerate(got):
        assert (lo.tolist(), hi.tolist(), dest.tolist()) == ([g + 1], [g + 6], [5 * g])
        assert data is groups._kept[(0, g)][0]
    groups.close()


def test_dropped_groups_records_are_written_again_only_once_no_round_reads_them() -> None:
    """A group's records buffer, once the group is dropped, takes a later group's records
    (fresh memory faults in page by page), but never while a round still copies out of it:
    every group's values are its own whatever was dropped meanwhile."""
    from stoker.loader.fastpath.plan import FastPlan
    from stoker.loader.fastpath.rowmajor import RecordLayout
    from stoker.loader.read.staging import StagedRecords

    def table(file: int, group: int) -> pa.Table:
        return pa.table({"label": np.full(ROWS, file * 1000 + group, dtype=np.int64)})

    first = table(0, 0).to_batches()[0]
    layout = RecordLayout.of(FastPlan(first.schema, ["label"], [], []), [first])
    groups = RowGroups(table, lambda f: np.full(8, ROWS), ["label"], lambda b: None,
                       int(2.5 * ROWS * layout.stride), lambda: layout)
    field = layout.fields[0]

    def values(data: StagedRecords) -> set[int]:
        return set(data.records[:, field.offset:field.offset + 8].view(np.int64).ravel().tolist())

    def buffer(data: StagedRecords) -> np.ndarray:
        root = data.records
        while isinstance(root.base, np.ndarray):
            root = root.base
        return root

    # weak: a reference would keep a buffer in use; a dead one cannot be mistaken for a new
    seen: list[weakref.ref[np.ndarray]] = []
    reused = 0
    for g in range(8):  # a sliding window: each group read once, two kept
        for data, *_ in groups.runs(0, np.array([g * ROWS]), np.array([g * ROWS + ROWS]),
                                    np.array([0])):
            assert values(data) == {g}
            root = buffer(data)
            reused += any(w() is root for w in seen)
            seen.append(weakref.ref(root))
            del root
    assert reused  # dropped groups' buffers came back
    held = groups.runs(1, np.array([0]), np.array([ROWS]), np.array([0]))
    data, *_ = next(held)  # a round copying out of file 1's group 0, not finished
    for g in range(1, 8):  # the decode-ahead thread and later rounds drop it meanwhile
        for other, *_ in groups.runs(1, np.array([g * ROWS]), np.array([g * ROWS + ROWS]),
                                     np.array([0])):
            assert other.records.ctypes.data != data.records.ctypes.data
            assert values(other) == {1000 + g}
    assert values(data) == {1000}  # never written again while read
    held.close()
    groups.close()


def test_only_a_reader_of_indexed_parquet_loads_the_transpose_kernel(tmp_path: Any) -> None:
    """Loading ``columns_to_records`` costs a warm-up thread ~0.2 s: a loader of stoker
    shards never starts it, a shuffled loader of indexed Parquet does; a natural-order one
    of a small dataset loads no kernel at all, nor Numba (~0.4 s holding the GIL while the
    first batches are read), on its first run as on a later one; none imports
    pyarrow.compute. Fresh processes (warm-ups are once per process) on a node whose kernels
    are compiled."""
    import os
    import subprocess
    import sys

    import pyarrow.parquet as pq

    from stoker.sharder import shard
    from stoker.tools.cli import main

    pq.write_table(pa.table({"x": np.arange(300, dtype=np.int64),
                             "y": np.arange(300, dtype=np.float32),
                             "z": pa.array([[float(i)] * 2 for i in range(300)],
                                           pa.list_(pa.float32()))}),
                   tmp_path / "a.parquet", row_group_size=100)
    shard(str(tmp_path / "a.parquet"), str(tmp_path / "shards"), progress=False)
    (tmp_path / "idx").mkdir()
    pq.write_table(pq.read_table(tmp_path / "a.parquet"), tmp_path / "idx" / "a.parquet",
                   row_group_size=100)
    assert main(["index", str(tmp_path / "idx"), "--quiet"]) == 0
    code = ("import sys; from stoker.loader import DataLoader, ReadOptions; "
            "from stoker.loader.jit import warmup; loader = DataLoader(sys.argv[1], "
            "batch_size=50, shuffle=sys.argv[2] == 'on', columns=['x', 'y', 'z'], "
            "read=ReadOptions(records_dir=sys.argv[3])); n = sum(1 for _ in loader); "
            "nat = getattr(loader._source, '_natural', None); "
            "print(n, nat and nat.stored.mapped, warmup.started(('columns_to_records',)), "
            "'numba' in sys.modules, 'pyarrow.compute' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "STOKER_COLD_START"}

    def run(data: str, shuffle: str) -> list[str]:
        return subprocess.run([sys.executable, "-c", code, str(tmp_path / data), shuffle,
                               str(tmp_path / "records")], check=True, capture_output=True,
                              text=True, env=env).stdout.split()[-5:]

    # (batches, groups read from the node, transpose kernel warmed, Numba, pyarrow.compute)
    assert run("idx", "off") == ["6", "0", "False", "False", "False"]  # a first run: decoded
    assert run("idx", "off") == ["6", "2", "False", "False", "False"]  # a later one
    assert run("shards", "on") == ["6", "None", "False", "True", "False"]
    assert run("idx", "on") == ["6", "None", "True", "True", "False"]
