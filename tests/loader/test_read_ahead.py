"""With ``num_workers=0`` a stoker dataset's next batches are read in one stoker thread while
the caller uses the current one (``WorkerOptions.read_ahead``): the same batches, byte for
byte and in the same order, as reading each in the caller's thread; a failure surfaces at its
own batch with its own type; and never where user code runs in a batch."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from stoker.loader import DataLoader, OptionsError, ReadOptions, WorkerOptions
from stoker.loader.read.arrow import ArrowSource

COLUMNS = ["id", "x", "y"]


def _raw(batch: dict[str, Any]) -> list[tuple[str, str, tuple[int, ...], bytes]]:
    return [(k, str(v.dtype), tuple(v.shape), v.numpy().tobytes()) for k, v in batch.items()]


def _loader(path: Path, read_ahead: bool = True, **kw: Any) -> DataLoader:
    kw.setdefault("read", ReadOptions(row_major=True))
    return DataLoader(str(path), columns=COLUMNS, seed=5, batch_size=16,
                      workers=WorkerOptions(read_ahead=read_ahead), **kw)


def _reader(dl: DataLoader) -> threading.Thread | None:
    """The loader's reader thread while it runs (its own: not another test's loader's)."""
    pool = dl._pool
    threads = getattr(pool, "_threads", [])
    return threads[0] if threads and threads[0].is_alive() and \
        threads[0].name == "stoker-reader-0" else None


def _epochs(dl: DataLoader, epochs: int) -> tuple[list[Any], set[bool]]:
    """Every batch of ``epochs`` epochs, and whether a reader thread ran at each."""
    out, reading = [], set()
    for e in range(epochs):
        dl.set_epoch(e)
        for b in dl:
            reading.add(_reader(dl) is not None)
            out.append(_raw(b))
    return out, reading


@pytest.mark.parametrize("row_major", [True, False])
@pytest.mark.parametrize("shuffle", [False, True])
def test_batches_read_ahead_equal_batches_read_when_asked(dataset: Path, shuffle: bool,
                                                          row_major: bool) -> None:
    """Two epochs (615 samples: the last batch short), from records and from columns."""
    read = ReadOptions(row_major=row_major)
    asked = _loader(dataset, read_ahead=False, shuffle=shuffle, read=read)
    want, reading = _epochs(asked, 2)
    asked.close()
    assert reading == {False}
    ahead = _loader(dataset, shuffle=shuffle, read=read)
    got, reading = _epochs(ahead, 2)
    assert reading == {True}
    assert ahead._pool is None  # each pass hands its reader back at its end
    ahead.close()
    assert len(got) == len(want) == 2 * 39
    assert got == want


def test_a_pass_resumed_mid_epoch_reads_the_same_rest(dataset: Path) -> None:
    """A state saved after 7 batches (others already read ahead) resumes at batch 7."""
    dl = _loader(dataset, shuffle=True)
    it = iter(dl)
    for _ in range(7):
        next(it)
    state = dl.state_dict()
    want = [_raw(b) for b in it]
    dl.close()
    resumed = _loader(dataset, read_ahead=False, shuffle=True)
    resumed.load_state_dict(state)
    assert [_raw(b) for b in resumed] == want
    resumed.close()


def test_a_failed_batch_fails_at_its_own_step(dataset: Path, monkeypatch: Any) -> None:
    """Batch 3's read fails (a fault injected into the source, read one batch at a time):
    batches 0-2 arrive, then ``next`` raises the same exception, naming batch 3."""
    asked = _loader(dataset, read_ahead=False, shuffle=True)
    want = [_raw(b) for b in asked]
    asked.close()
    dl = _loader(dataset, shuffle=True)
    bad = np.asarray(list(dl.batch_sampler)[3])
    fetch = ArrowSource.fetch

    def failing(self: ArrowSource, ids: np.ndarray, *args: Any) -> Any:
        if np.array_equal(np.asarray(ids), bad):
            raise ValueError("injected: batch 3 is unreadable")
        return fetch(self, ids, *args)

    monkeypatch.setattr(ArrowSource, "fetch", failing)
    monkeypatch.setattr(ArrowSource, "group_rows", property(lambda self: 0))
    it = iter(dl)
    assert [_raw(next(it)) for _ in range(3)] == want[:3]
    with pytest.raises(ValueError, match="batch 3 is unreadable") as caught:
        next(it)
    assert any("batch 3" in n and "reader thread" in n
               for n in getattr(caught.value, "__notes__", []))
    dl.close()


@pytest.mark.parametrize("where", ["collate_fn", "transform"])
def test_user_code_keeps_every_batch_in_the_callers_thread(dataset: Path, where: str) -> None:
    """With a ``collate_fn`` or a ``transform`` the batch runs user code: it runs in the
    caller's thread, outside any worker (``get_worker_info()`` is ``None``), as torch's
    ``num_workers=0`` runs it; no reader thread starts."""
    seen: list[tuple[threading.Thread, Any]] = []

    def user(batch: Any) -> Any:
        seen.append((threading.current_thread(), torch.utils.data.get_worker_info()))
        return batch

    dl = _loader(dataset, **{where: user})
    for _ in dl:
        assert dl._pool is None
    dl.close()
    assert len(seen) == 39
    assert set(seen) == {(threading.main_thread(), None)}


def test_read_ahead_must_be_a_bool() -> None:
    with pytest.raises(OptionsError, match="read_ahead='yes' must be True or False"):
        WorkerOptions(read_ahead="yes")  # type: ignore[arg-type]
