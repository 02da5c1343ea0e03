"""Ledger writer and reader: round trip, size per step, appends, crashes, credentials."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from stoker.loader.ledger.writer import LedgerError, LedgerWriter, ledger_path, read_ledger
from stoker.loader.ledger.format import ids_digest, iter_frames

SECRET = "hunter2-SECRET-c0ffee"


def _head(**kw: object) -> dict:
    return {"dataset": "/data/x", "fingerprint": "f" * 32, "seed": 3, "rank": 0,
            "world_size": 1, "global_batch": 4, "num_samples": 400, **kw}


def _write(path: Path, n: int, *, ids: bool = False, seed: int = 0,
           **kw: object) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    batches = [rng.permutation(1000)[:32].astype(np.int64) for _ in range(n)]
    with LedgerWriter(path, _head(), ids=ids, **kw) as w:
        for s, b in enumerate(batches):
            w.step(s // 100, s % 100, 0, b, float(rng.random() * 1e-3),
                   float(0.02 + rng.random() * 1e-3))
    return batches


def test_round_trip_steps_events_ids(tmp_path: Path) -> None:
    path = tmp_path / "a.ledger"
    w = LedgerWriter(path, _head(), ids=True, flush_steps=7)
    batches = [np.arange(i, i + 5, dtype=np.int64) * 3 for i in range(20)]
    for s, b in enumerate(batches):
        w.step(0, s, 0, b, 0.5, 1.25)
        if s == 9:
            w.event("retry", shard="shards/00001.arrow", attempt=np.int64(2))
    w.close()
    w.close()  # idempotent
    led = read_ledger(path)
    assert not led.truncated and len(led.segments) == 1 and led.segments[0].closed
    h = led.header
    assert h["seed"] == 3 and h["ids"] is True and h["format"] == "stoker-ledger/1"
    assert set(h["versions"]) >= {"stoker", "torch", "numpy", "pyarrow", "numba", "python"}
    assert h["host"] and h["start_time"]
    assert led.steps["step"].tolist() == list(range(20))
    assert led.steps["digest"].tolist() == [ids_digest(b) for b in batches]
    assert led.steps["count"].tolist() == [5] * 20
    assert np.all(led.steps["wait_s"] == np.float32(0.5))
    assert led.ids.tolist() == np.concatenate(batches).tolist()
    assert led.segments[0].step_ids(4).tolist() == batches[4].tolist()
    assert led.events == [{"kind": "retry", "at": 10, "time": led.events[0]["time"],
                           "shard": "shards/00001.arrow", "attempt": 2, "segment": 0}]


def test_digest_is_xxh3_64_of_little_endian_int64() -> None:
    import xxhash

    ids = np.array([7, 2, -1], dtype=np.int32)
    assert ids_digest(ids) == xxhash.xxh3_64_intdigest(
        b"".join(int(i).to_bytes(8, "little", signed=True) for i in ids))


def test_bytes_per_step_without_ids_is_small(tmp_path: Path) -> None:
    path = tmp_path / "a.ledger"
    _write(path, 5000)
    per_step = path.stat().st_size / 5000
    assert per_step <= 24, per_step  # the issue asks for at most ~32


def test_reopen_appends_a_segment(tmp_path: Path) -> None:
    path = tmp_path / "a.ledger"
    _write(path, 10)
    _write(path, 5, seed=1)
    led = read_ledger(path)
    assert [s.header["segment"] for s in led.segments] == [0, 1]
    assert [len(s.steps) for s in led.segments] == [10, 5]
    assert len(led.steps) == 15


def test_damaged_tail_is_reported_then_dropped_on_append(tmp_path: Path) -> None:
    path = tmp_path / "a.ledger"
    _write(path, 300, flush_steps=100)
    data = path.read_bytes()
    frames = list(iter_frames(data))
    last_steps = [f for f in frames if f[2] == 2][-1]
    for cut in (last_steps[0] + 3, (last_steps[0] + last_steps[1]) // 2, last_steps[1] - 1):
        path.write_bytes(data[:cut])
        led = read_ledger(path)
        assert led.truncated and led.truncated_at == last_steps[0]
        assert led.steps["step"].tolist() == [s % 100 for s in range(200)]
        assert not led.segments[0].closed
    flipped = bytearray(data)
    flipped[last_steps[1] - 2] ^= 0xFF  # corrupt payload: the checksum catches it
    path.write_bytes(bytes(flipped))
    assert read_ledger(path).truncated_at == last_steps[0]
    path.write_bytes(data[:last_steps[1] - 1])
    _write(path, 3)
    led = read_ledger(path)
    assert not led.truncated and len(led.steps) == 203
    assert led.segments[1].header["dropped_tail_bytes"] == last_steps[1] - 1 - last_steps[0]


def test_sigkilled_writer_leaves_a_readable_prefix(tmp_path: Path) -> None:
    path = tmp_path / "k.ledger"
    script = textwrap.dedent(f"""
        import sys, numpy as np
        from stoker.loader.ledger.writer import LedgerWriter
        w = LedgerWriter({str(path)!r}, {{"seed": 1, "rank": 0, "world_size": 1}},
                         ids=True, flush_steps=64)
        step = 0
        while True:
            w.step(0, step, 0, np.arange(step * 4, step * 4 + 4), 0.0, 0.001)
            step += 1
            if step == 640:
                print("ready", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    led = read_ledger(path)
    n = len(led.steps)
    assert n >= 640 and n % 64 == 0  # whole frames only
    assert led.steps["step"].tolist() == list(range(n))
    assert led.ids.tolist() == list(range(n * 4))
    assert not led.segments[0].closed


def test_credentials_never_reach_the_file(tmp_path: Path) -> None:
    path = tmp_path / "a.ledger"
    head = _head(dataset=f"s3://user:{SECRET}@bucket/data?X-Amz-Signature={SECRET}#frag",
                 storage_options={"key": "id", "secret": SECRET},
                 order={"shuffle": True, "api_key": SECRET})
    with LedgerWriter(path, head) as w:
        w.step(0, 0, 0, np.arange(4), 0.0, 0.0)
        w.event("retry", url=f"https://host/x?token={SECRET}", credentials={"t": SECRET},
                note=[f"gs://a:{SECRET}@b/c"])
    data = path.read_bytes()
    plain = b"".join(raw for _, _, _, raw in iter_frames(data))
    assert SECRET.encode() not in data and SECRET.encode() not in plain
    led = read_ledger(path)
    assert led.header["dataset"] == "s3://bucket/data"
    assert "storage_options" not in led.header
    assert led.events[0]["url"] == "https://host/x" and "credentials" not in led.events[0]


def test_ledger_path_rules(tmp_path: Path) -> None:
    assert ledger_path("runs/a.ledger") == Path("runs/a.ledger")
    assert ledger_path("runs/a.ledger", 3, 4) == Path("runs/a.rank3.ledger")
    assert ledger_path("runs/a", 1, 2) == Path("runs/a.rank1.ledger")
    assert ledger_path("runs/", 2, 4) == Path("runs/rank00002.ledger")
    assert ledger_path(tmp_path, 0, 1) == tmp_path / "rank00000.ledger"


def test_misuse_gives_clear_errors(tmp_path: Path) -> None:
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    with pytest.raises(LedgerError, match="not a stoker ledger"):
        LedgerWriter(other, _head())
    with pytest.raises(LedgerError, match="not a stoker ledger"):
        read_ledger(other)
    w = LedgerWriter(tmp_path / "a.ledger", _head())
    w.close()
    with pytest.raises(LedgerError, match="after close"):
        w.step(0, 0, 0, np.arange(2), 0.0, 0.0)
    with pytest.raises(ValueError, match="flush_steps"):
        LedgerWriter(tmp_path / "b.ledger", _head(), flush_steps=0)


def test_unclosed_writer_is_flushed_at_garbage_collection(tmp_path: Path) -> None:
    import gc

    w = LedgerWriter(tmp_path / "a.ledger", _head())
    w.step(0, 0, 0, np.arange(2), 0.0, 0.0)
    del w
    gc.collect()
    led = read_ledger(tmp_path / "a.ledger")
    assert len(led.steps) == 1 and led.segments[0].closed
