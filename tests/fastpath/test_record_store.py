"""Row-major records on disk (stoker.loader.fastpath.record_store): built once, mapped by later
processes, verified, bounded, and never able to change a batch."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # for fastpath_helpers (importlib mode)

from fastpath_helpers import record_table, write_dataset  # noqa: E402

from stoker.loader import DataLoader, ReadOptions  # noqa: E402
from stoker.loader.fallbacks import collecting, drain  # noqa: E402
from stoker.loader.read.arrow import ArrowSource  # noqa: E402
from stoker.loader.fastpath import rowmajor, shard_records  # noqa: E402
from stoker.loader.fastpath.advise import smaps_entry  # noqa: E402
from stoker.loader.fastpath.record_store import RecordStore, default_dir  # noqa: E402
from stoker.manifest import Manifest  # noqa: E402

FEATS, CATS = ["f0", "f1"], ["c0"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Manifest:
    tables = [record_table(n, start, s)
              for s, (n, start) in enumerate([(60, 0), (45, 60), (30, 105)])]
    return write_dataset(tmp_path_factory.mktemp("records"), tables, batch_rows=8)


def _bytes(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.dtype, tuple(v.shape), v.numpy().tobytes()) if isinstance(v, torch.Tensor)
            else v for k, v in batch.items()}


def _source(m: Manifest, where: Path | None, **kwargs: Any) -> ArrowSource:
    return ArrowSource(m, features=FEATS, categoricals=CATS, row_major="auto",
                       row_major_dir=None if where is None else str(where), **kwargs)


def _columns(m: Manifest) -> ArrowSource:
    return ArrowSource(m, features=FEATS, categoricals=CATS, row_major=False)


def _served(src: ArrowSource, ids: np.ndarray) -> dict[str, Any]:
    src.fetch(ids)  # opens the shards; their records are built or mapped in the background
    src.wait_row_major()
    return _bytes(src.fetch(ids))


def _files(where: Path) -> list[Path]:
    return sorted(where.glob("*.rec"))


def _file_backed(records: np.ndarray) -> bool:
    return not records.flags.writeable  # mapped read-only from the store


IDS = np.random.default_rng(0).permutation(135)


def test_second_process_maps_the_records_the_first_saved(dataset: Manifest,
                                                         tmp_path: Path) -> None:
    expected = _bytes(_columns(dataset).fetch(IDS))
    first = _source(dataset, tmp_path)
    assert _served(first, IDS) == expected
    assert len(_files(tmp_path)) == 3  # one file per shard
    # the owner switched to the saved files (shared page cache instead of private memory)
    assert all(_file_backed(r) for r in first._records._records.values())
    stamps = [f.stat().st_mtime_ns for f in _files(tmp_path)]
    second = _source(dataset, tmp_path)
    assert _served(second, IDS) == expected
    assert sorted(second._records._records) == [0, 1, 2]
    assert all(_file_backed(r) for r in second._records._records.values())
    assert [f.stat().st_mtime_ns >= t for f, t in zip(_files(tmp_path), stamps)] == [True] * 3
    assert len(_files(tmp_path)) == 3  # mapped, not written again


def test_waiting_waits_for_every_build_of_every_builder(dataset: Manifest, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Records build on several threads (shard_records._BUILDERS): waiting for them returns
    once the slowest build is saved, not when one builder thread is idle again."""
    real = rowmajor.Tiles.build

    def slow_first(self: rowmajor.Tiles) -> np.ndarray:
        if self.rows == 60:  # shard 0: the other shards build meanwhile
            time.sleep(0.5)
        return real(self)

    monkeypatch.setattr(rowmajor.Tiles, "build", slow_first)
    assert shard_records._BUILDERS >= 2
    src = _source(dataset, tmp_path)
    src.fetch(IDS)
    src.wait_row_major()
    assert len(_files(tmp_path)) == 3
    assert sorted(src._records._records) == [0, 1, 2]
    assert all(_file_backed(r) for r in src._records._records.values())


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_files_are_rebuilt_never_served(dataset: Manifest, tmp_path: Path,
                                                damage: str) -> None:
    expected = _served(_source(dataset, tmp_path), IDS)
    victim = _files(tmp_path)[0]
    raw = bytearray(victim.read_bytes())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0x40
    else:
        raw = raw[:-5]
    victim.write_bytes(bytes(raw))
    again = _source(dataset, tmp_path)
    assert _served(again, IDS) == expected
    assert len(_files(tmp_path)) == 3
    store = RecordStore(str(tmp_path))
    for f in _files(tmp_path):  # every file verifies again (the damaged one was rewritten)
        assert store.open(f.name, f.stat().st_size - 16) is not None


def test_a_different_layout_gets_different_files(dataset: Manifest, tmp_path: Path) -> None:
    _served(_source(dataset, tmp_path), IDS)
    other = ArrowSource(dataset, features=["f1", "f0"], categoricals=CATS, row_major="auto",
                        row_major_dir=str(tmp_path))
    ref = ArrowSource(dataset, features=["f1", "f0"], categoricals=CATS, row_major=False)
    assert _served(other, IDS) == _bytes(ref.fetch(IDS))
    assert len(_files(tmp_path)) == 6


def test_the_directory_is_bounded_least_recently_used_first(dataset: Manifest,
                                                            tmp_path: Path) -> None:
    _served(_source(dataset, tmp_path), IDS)
    sizes = {f.name: f.stat().st_size for f in _files(tmp_path)}
    oldest = min(_files(tmp_path), key=lambda f: f.stat().st_mtime_ns)
    os.utime(oldest, (1, 1))
    store = RecordStore(str(tmp_path), limit=sum(sizes.values()))
    assert store.save("new.rec", np.zeros(10, dtype=np.uint8))
    assert not oldest.exists() and len(_files(tmp_path)) == 3
    assert not Path(f"{oldest}.lock").exists()  # lock files go with their records
    assert store.open("new.rec", 10) is not None
    assert not store.save("new.rec", np.ones(10, dtype=np.uint8))  # exists: kept


def test_an_unusable_directory_falls_back_to_memory(dataset: Manifest, tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with caplog.at_level(logging.WARNING):
        src = _source(dataset, blocker / "records")
        got = _served(src, IDS)
    assert "stay in memory" in caplog.text
    assert got == _bytes(_columns(dataset).fetch(IDS))
    assert len(src._records) == 3 and not any(_file_backed(r) for r in
                                                src._records._records.values())


def test_forked_workers_map_saved_records_and_build_none(dataset: Manifest,
                                                         tmp_path: Path) -> None:
    worker = _source(dataset, tmp_path)
    worker._rm.owner_pid = -1  # as in a worker process forked after construction
    _served(worker, IDS)
    assert len(worker._records) == 0 and _files(tmp_path) == []
    _served(_source(dataset, tmp_path), IDS)  # the owner builds and saves them
    worker = _source(dataset, tmp_path)
    worker._rm.owner_pid = -1
    _served(worker, IDS)
    assert len(worker._records) == 3


def test_default_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("STOKER_ROW_MAJOR_DIR", str(tmp_path / "x"))
    assert default_dir("/cache") == str(tmp_path / "x")
    monkeypatch.setenv("STOKER_ROW_MAJOR_DIR", "")
    assert default_dir("/cache") is None
    monkeypatch.delenv("STOKER_ROW_MAJOR_DIR")
    assert default_dir("/cache") == os.path.join("/cache", "row-major")
    monkeypatch.delenv("STOKER_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_dir(None) == str(tmp_path / "stoker" / "row-major")
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "node"))  # the node cache moves them
    assert default_dir(None) == str(tmp_path / "node" / "row-major")


def test_dataloader_keeps_records_in_the_node_cache_dir(dataset: Manifest, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A local dataset read without a cache keeps its records under ``$STOKER_CACHE_DIR``."""
    monkeypatch.delenv("STOKER_ROW_MAJOR_DIR")
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "node"))
    loader = DataLoader(dataset, batch_size=16, read=ReadOptions(features=FEATS))
    try:
        assert loader._source._rm.store_dir == str(tmp_path / "node" / "row-major")
    finally:
        loader.close()


def test_dataloader_passes_the_directory(dataset: Manifest, tmp_path: Path) -> None:
    def epoch(where: Any) -> list[dict[str, Any]]:
        loader = DataLoader(dataset, batch_size=16, shuffle=True, seed=5,
                            read=ReadOptions(features=FEATS, categoricals=CATS, records_dir=where))
        return [_bytes(b) for b in loader]

    assert epoch(tmp_path) == epoch(False) == epoch(tmp_path)
    loader = DataLoader(dataset, batch_size=16,
                        read=ReadOptions(features=FEATS, records_dir=False))
    assert loader._source._rm.store_dir is None


SCRIPT = """
import sys
import numpy as np
from stoker.loader import DataLoader, ReadOptions, WorkerOptions
loader = DataLoader(sys.argv[1], batch_size=32, shuffle=True, seed=1, num_workers=2,
                    read=ReadOptions(features=["f0", "f1"], categoricals=["c0"],
                                     records_dir=sys.argv[2]),
                    workers=WorkerOptions(mode="process"))
out = [b["features"].numpy().tobytes() + b["id"].numpy().tobytes() for e in range(2)
       for b in loader]
print(len(out), hash(b"".join(out)))
"""


def test_process_workers_share_the_files(dataset: Manifest, tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    where = tmp_path / "records"

    def run() -> str:
        out = subprocess.run([sys.executable, str(script), str(dataset.root), str(where)],
                             capture_output=True, text=True, timeout=300,
                             env={**os.environ, "PYTHONHASHSEED": "0"})
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout

    # the workers build nothing (no private copies); the loader's own process opened the
    # shards of their first tasks before forking them and built each shard's records once
    cold = run()
    assert len(_files(where)) == dataset.num_shards
    _served(_source(dataset, where), IDS)
    assert run() == cold  # now both workers map the same files: same batches


NATURAL = """
import sys
from stoker.loader import DataLoader, ReadOptions, WorkerOptions
loader = DataLoader(sys.argv[1], batch_size=8, num_workers=2, prefetch_factor=1,
                    read=ReadOptions(features=["f0", "f1"], categoricals=["c0"],
                                     records_dir=sys.argv[2]),
                    workers=WorkerOptions(mode="process"))
print(sum(len(b["id"]) for b in loader))
loader._source.wait_row_major()
"""


def test_process_workers_get_the_records_of_every_shard_they_reach(tmp_path: Path) -> None:
    """Forked workers build no records; the loader's own process opens the shards of every
    task it hands out, not only of the first ones, and saves their records for them (else
    a run with process workers only never had records past its first tasks' shards)."""
    tables = [record_table(24, 24 * s, s) for s in range(8)]
    dataset = write_dataset(tmp_path / "data", tables, batch_rows=8)
    script, where = tmp_path / "run.py", tmp_path / "records"
    script.write_text(NATURAL)
    out = subprocess.run([sys.executable, str(script), str(dataset.root), str(where)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["192"]
    assert len(_files(where)) == dataset.num_shards


OPEN_BEFORE_FORK = """
import json, sys
from stoker.loader import DataLoader, ReadOptions, WorkerOptions
from stoker.loader.read import arrow
arrow._OPEN_ALL = int(sys.argv[3])
loader = DataLoader(sys.argv[1], batch_size=8, num_workers=2, prefetch_factor=1,
                    read=ReadOptions(features=["f0", "f1"], categoricals=["c0"],
                                     records_dir=sys.argv[2]),
                    workers=WorkerOptions(mode="process"))
it = iter(loader)  # the workers are forked here
opened = sorted(loader._source._shards.opened_shards)
ids = [int(i) for b in it for i in b["id"]]
loader._source.wait_row_major()
print(json.dumps({"opened": opened, "ids": ids}))
"""


def test_a_small_dataset_with_stored_records_opens_whole_before_the_fork(
        tmp_path: Path) -> None:
    """Its workers inherit every shard: none opens one again between batches."""
    tables = [record_table(200, 200 * s, s) for s in range(4)]  # first tasks: 128 rows
    dataset = write_dataset(tmp_path / "data", tables, batch_rows=8)
    script, where = tmp_path / "run.py", tmp_path / "records"
    script.write_text(OPEN_BEFORE_FORK)

    def run(open_all: int) -> dict[str, Any]:
        out = subprocess.run([sys.executable, str(script), str(dataset.root), str(where),
                              str(open_all)], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    # nothing stored yet: the shards of the first tasks only, and in natural order the next
    first = run(16)
    assert first["opened"] == [0, 1] and first["ids"] == list(range(800))
    assert len(_files(where)) == 4
    assert run(16) == {"opened": [0, 1, 2, 3], "ids": first["ids"]}
    assert run(3)["opened"] == [0, 1]  # more shards than _OPEN_ALL: as before


@pytest.mark.timeout(120)
def test_a_shard_that_cannot_open_ahead_fails_at_its_own_batch(tmp_path: Path) -> None:
    """Opening a shard ahead for process workers is only for its records: a broken shard
    still fails at the first batch that reads it (every batch before it delivered, the error
    naming the shard and the batch), as without the step, and the failed opening ahead is
    counted once."""
    from stoker.loader import WorkerOptions
    from stoker.loader.errors import WorkerError

    tables = [record_table(24, 24 * s, s) for s in range(12)]
    dataset = write_dataset(tmp_path / "data", tables, batch_rows=8)
    broken = sorted((tmp_path / "data").rglob("*.arrow"))[10]
    raw = bytearray(broken.read_bytes())
    raw[-40:-10] = b"\xff" * 30  # the IPC footer: same size, cannot open
    broken.write_bytes(bytes(raw))
    loader = DataLoader(str(dataset.root), batch_size=8, num_workers=2, prefetch_factor=1,
                        read=ReadOptions(features=FEATS, categoricals=CATS,
                                         records_dir=tmp_path / "records"),
                        workers=WorkerOptions(mode="process"))
    rows = []
    with pytest.raises(WorkerError, match=r"shard 10 .* \(reading samples \[240, 241"):
        for batch in loader:
            rows.extend(batch["id"].tolist())
    assert rows == list(range(240))
    # opened in the background once the workers forked: counted by a batch, or still pending
    while loader._source._next._asked:  # asked before its task went out (the test's timeout)
        time.sleep(0.005)
    assert loader.stats.fallbacks.get("open_ahead_failed", 0) + \
        drain().get("open_ahead_failed", [0])[0] == 1


def test_orphaned_temporary_files_are_removed(tmp_path: Path) -> None:
    store = RecordStore(str(tmp_path))
    orphan, fresh = tmp_path / ".writing-old.rec", tmp_path / ".writing-new.rec"
    orphan.write_bytes(b"x" * 100)
    fresh.write_bytes(b"x" * 100)
    os.utime(orphan, (1, 1))  # a writer killed long ago
    assert store.save("a.rec", np.arange(8, dtype=np.uint8))
    assert not orphan.exists() and fresh.exists()  # a recent one may be mid-write
    assert store.open("a.rec", 8).tolist() == list(range(8))


def test_nothing_is_written_when_the_disk_would_run_low(dataset: Manifest,
                                                        tmp_path: Path) -> None:
    full = RecordStore(str(tmp_path), min_free=1.0)  # no filesystem keeps 100 % free
    with collecting() as noted:
        assert not full.save("a.rec", np.zeros(10, dtype=np.uint8))
    assert _files(tmp_path) == []
    count, detail = noted["records_not_saved"]  # said, never silent
    assert count == 1 and "a.rec (26 bytes)" in detail and "less than 100% free" in detail
    assert RecordStore(str(tmp_path), min_free=0.0).save("a.rec", np.zeros(10, dtype=np.uint8))


def test_a_forked_worker_maps_records_another_process_saved_later(
        dataset: Manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forked worker under "auto" builds no records; once another process (the loader's
    own) saved them, its next batch with rows lacking records maps them, and batches stay
    byte for byte the column path's."""
    from stoker.loader.fastpath import shard_records

    monkeypatch.setattr(shard_records, "_LOOK_S", 0.0)
    where = tmp_path / "records"
    worker = _source(dataset, where)
    worker._rm.owner_pid = -1  # as in a process forked from the records' owner
    want = _bytes(_columns(dataset).fetch(IDS))
    assert _served(worker, IDS) == want
    assert worker._records is not None and len(worker._records) == 0 and not _files(where)
    _served(_source(dataset, where), IDS)  # the owner builds and saves every shard's records
    assert len(_files(where)) == dataset.num_shards
    assert _bytes(worker.fetch(IDS)) == want
    assert len(worker._records) == dataset.num_shards  # mapped from the saved files


def test_records_built_in_place_are_published_verified_and_never_half_written(
        tmp_path: Path) -> None:
    """RecordStore.build (worker processes wait for the file): the bytes a fill writes are
    published under the name with their digest, as a save publishes them; a file that exists
    is not built again; a fill that fails leaves nothing; a temporary file deleted meanwhile
    (room made for a shard) is not published, and says so. Tile claims for other processes
    (``tiles``) go with the build, published or failed."""
    from stoker.cache.lock import FileLock

    store = RecordStore(str(tmp_path))
    want = np.arange(64, dtype=np.uint8)

    def fill(out: np.ndarray, claims: Any) -> None:
        assert claims is None  # no tiles asked
        out[:] = want

    got = store.build("a.rec", 64, fill)
    assert got is not None and np.array_equal(got, want) and _file_backed(got)
    assert np.array_equal(store.open("a.rec", 64), want)
    assert (tmp_path / "a.rec").stat().st_size == 64 + 16
    assert store.build("a.rec", 64, lambda out, claims: pytest.fail("built twice")) is None

    def broken(out: np.ndarray, claims: Any) -> None:
        assert claims is not None and (tmp_path / "b.rec.tiles").exists()
        out[:4] = 1
        raise ValueError("kernel failed")

    with pytest.raises(ValueError, match="kernel failed"):
        store.build("b.rec", 64, broken, tiles=2)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == \
        ["a.rec"]

    def evicted(out: np.ndarray, claims: Any) -> None:
        out[:] = want
        for p in tmp_path.glob(".writing*"):
            p.unlink()

    with collecting() as noted:
        got = store.build("c.rec", 64, evicted)
    assert got is not None and np.array_equal(got, want)  # still this process's records
    assert not (tmp_path / "c.rec").exists()
    assert noted["records_not_saved"][0] == 1 and "deleted while being written" in \
        noted["records_not_saved"][1]

    busy = FileLock(str(tmp_path / "d.rec") + ".lock")
    assert busy.acquire(timeout=0)
    try:  # another process builds it: this one builds in memory
        assert store.build("d.rec", 64, lambda out, claims: pytest.fail("two writers")) is None
    finally:
        busy.release()


def test_written_waits_for_the_process_writing_a_file(tmp_path: Path) -> None:
    """``RecordStore.written``: ``True`` at once when no process writes the file, ``False``
    when the writer still holds its lock at the timeout, ``True`` once it let go (a writer in
    another process, holding ``<name>.lock`` as build and save do, that writes a marker
    just before it lets go: seen, the wait lasted until then)."""
    store = RecordStore(str(tmp_path))
    name = "ab" * 16
    assert store.written(name, 5.0) is True
    lock, marker = store._path(name) + ".lock", tmp_path / "done"
    writer = subprocess.Popen([sys.executable, "-c", (
        "import pathlib, sys, time; from stoker.cache.lock import FileLock; "
        "l = FileLock(sys.argv[1]); l.acquire(); print('held', flush=True); "
        "time.sleep(float(sys.argv[2])); pathlib.Path(sys.argv[3]).touch(); l.release()"),
        lock, "1.5", str(marker)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "held"
        assert store.written(name, 0.05) is False  # still writing
        assert not marker.exists()
        assert store.written(name, 30.0) is True  # it let go
        assert marker.exists()
    finally:
        writer.wait(10)


def _vm_flags(arr: np.ndarray) -> list[str]:
    """The ``VmFlags`` of the map holding ``arr``."""
    return smaps_entry(arr.ctypes.data)["VmFlags"].split()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise flags: Linux")
def test_a_mapped_record_file_is_advised_huge_pages(tmp_path: Path) -> None:
    """A record file ``open`` maps is advised ``MADV_HUGEPAGE`` (smaps flag ``hg``), so its
    page cache is read back in 2 MB folios and gathers take one TLB entry per 2 MB
    (bench/hugepages_bench.py); its bytes are the ones saved, and a file built in place is
    not advised (that built slower)."""
    store = RecordStore(str(tmp_path))
    want = np.random.default_rng(3).integers(0, 256, size=3 << 20, dtype=np.uint8)
    assert store.save("a.rec", want)
    with collecting() as noted:
        got = store.open("a.rec", want.nbytes)
    assert got is not None and np.array_equal(got, want)
    assert "hg" in _vm_flags(got) and not noted
    built = store.build("b.rec", 1 << 21, lambda out, claims: out.fill(7))
    assert built is not None and "hg" not in _vm_flags(built)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise: Linux")
def test_refused_huge_pages_are_a_counted_fallback_with_the_same_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel that refuses the huge-page advice (here: advice it does not know, so the
    kernel itself says EINVAL) costs speed, never bytes: the records are served, the refusal
    is the counted ``"no_huge_pages"`` fallback naming the file and its size, asked once per
    process."""
    from stoker.loader.fastpath import record_store

    monkeypatch.setattr(record_store, "_HUGEPAGE", 9999)
    monkeypatch.setattr(record_store, "_refused", set())
    store = RecordStore(str(tmp_path))
    want = np.arange(4096, dtype=np.uint8)
    assert store.save("a.rec", want) and store.save("b.rec", want[::-1].copy())
    with collecting() as noted:
        a = store.open("a.rec", want.nbytes)
        b = store.open("b.rec", want.nbytes)
    assert a is not None and np.array_equal(a, want)
    assert b is not None and np.array_equal(b, want[::-1])
    count, detail = noted["no_huge_pages"]
    assert count == 1 and "a.rec (4112 bytes)" in detail and "hg" not in _vm_flags(a)
