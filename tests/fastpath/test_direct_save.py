"""Record files written past the page cache (``RecordStore.save(direct=True)``): the bytes on
disk are the records and their digest whatever their size and alignment, the page cache holds
the file afterwards only because the idle helper read it in, and a platform or helper that
refuses is a counted fallback with the same bytes."""

from __future__ import annotations

import mmap
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.loader.fallbacks import collecting
from stoker.loader.fastpath import record_store
from stoker.loader.fastpath.advise import cached_pages
from stoker.loader.fastpath.record_store import RecordStore

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="O_DIRECT: Linux")

BLOCK = 4096


def _resident(path: Path) -> float:
    """Share of the file's pages in the page cache."""
    pages = cached_pages(str(path))
    assert pages is not None, "mincore is not available here"
    return float(pages.mean())


def _records(nbytes: int, offset: int, seed: int) -> np.ndarray:
    """``nbytes`` random bytes starting ``offset`` bytes into a page-aligned buffer."""
    buf = np.frombuffer(mmap.mmap(-1, nbytes + offset + 1), dtype=np.uint8)
    out = buf[offset:offset + nbytes]
    out[:] = np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)
    return out


@settings(max_examples=40, deadline=None)
@given(blocks=st.integers(0, 40), rest=st.sampled_from([0, 1, 15, 16, 511, 512, 4095]),
       offset=st.sampled_from([0, 8, 512, 4096]), chunk=st.sampled_from([BLOCK, 3 * BLOCK, 1 << 20]))
def test_a_direct_save_writes_the_records_and_their_digest_exactly(
        tmp_path_factory: pytest.TempPathFactory, blocks: int, rest: int, offset: int,
        chunk: int) -> None:
    """Whole blocks straight from aligned memory or through the bounce buffer, in chunks that
    end on a block or not, then the part block and the digest: the file is byte for byte the
    records and their xxh3-128, and ``open`` serves them."""
    where = tmp_path_factory.mktemp("direct")
    mp = pytest.MonkeyPatch()
    mp.setattr(record_store, "_WRITE_CHUNK", chunk)
    mp.setattr(record_store, "_warm", lambda path: True)
    try:
        want = _records(blocks * BLOCK + rest, offset, blocks * 7 + rest)
        store = RecordStore(str(where))
        with collecting() as noted:
            assert store.save("a.rec", want, direct=True)
        assert not noted
        raw = want.tobytes()
        assert (where / "a.rec").read_bytes() == raw + xxhash.xxh3_128_digest(raw)
        got = store.open("a.rec", want.nbytes)
        assert got is not None and np.array_equal(got, want)
    finally:
        mp.undo()


def test_a_direct_save_bypasses_the_page_cache_and_the_helper_fills_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the helper the file's pages are not cached after the save (written past the
    cache: at most its last page, written through it); with it they all are."""
    want = _records(8 << 20, 0, 1)
    store = RecordStore(str(tmp_path))
    monkeypatch.setattr(record_store, "_warm", lambda path: True)
    assert store.save("cold.rec", want, direct=True)
    assert _resident(tmp_path / "cold.rec") <= 2 / ((8 << 20) // BLOCK)
    monkeypatch.undo()
    with collecting() as noted:
        assert store.save("warm.rec", want, direct=True)
    assert not noted
    assert _resident(tmp_path / "warm.rec") == 1.0
    assert (tmp_path / "warm.rec").read_bytes() == (tmp_path / "cold.rec").read_bytes()


def test_no_o_direct_is_a_counted_fallback_with_the_same_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(record_store, "_O_DIRECT", None)
    want = _records(3 * BLOCK + 5, 0, 2)
    store = RecordStore(str(tmp_path))
    with collecting() as noted:
        assert store.save("a.rec", want, direct=True)
    count, detail = noted["records_buffered"]
    assert count == 1 and "a.rec" in detail and "O_DIRECT" in detail
    raw = want.tobytes()
    assert (tmp_path / "a.rec").read_bytes() == raw + xxhash.xxh3_128_digest(raw)


def test_a_failing_helper_is_a_counted_fallback_and_the_file_is_served(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A helper that exits non-zero leaves the file as written; the next ``open`` reads it
    from the disk."""
    monkeypatch.setattr(record_store, "_HELPER", "import sys; sys.exit('no page cache today')")
    want = _records(2 * BLOCK, 0, 3)
    store = RecordStore(str(tmp_path))
    with collecting() as noted:
        assert store.save("a.rec", want, direct=True)
    count, detail = noted["records_not_warmed"]
    assert count == 1 and "a.rec" in detail and "no page cache today" in detail
    got = store.open("a.rec", want.nbytes)
    assert got is not None and np.array_equal(got, want)


def test_the_helper_runs_at_the_lowest_priority(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The helper reads at nice 19: the batches' threads come first."""
    nice = tmp_path / "nice"
    monkeypatch.setattr(record_store, "_HELPER", record_store._HELPER + (
        f"\nopen({str(nice)!r}, 'w').write(str(os.getpriority(os.PRIO_PROCESS, 0)))\n"))
    path = tmp_path / "a.rec"
    path.write_bytes(b"x" * BLOCK)
    assert record_store._warm(str(path))
    assert int(nice.read_text()) == 19
