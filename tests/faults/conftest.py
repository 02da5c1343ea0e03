"""Fixtures for the fault-injection suite: loopback servers and the after-every-trial checks.

``tests/servers`` is put on ``sys.path`` the same way ``tests/cache/conftest.py`` does, so the
suite reuses the real servers (nginx, the fault-injecting HTTP server) instead of copies.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import psutil
import pytest

SERVERS = Path(__file__).resolve().parents[1] / "servers"
if str(SERVERS) not in sys.path:
    sys.path.insert(0, str(SERVERS))
HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from fault_server import FaultServer  # noqa: E402
from server_fixtures import fault_server, nginx  # noqa: E402,F401 - shared fixtures

from stoker.manifest import Manifest, hash_file  # noqa: E402

_SETTLE_S = 5.0


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _shm() -> set[str]:
    """/dev/shm entries that this process tree could have made.

    The machine is shared: other programs' multiprocessing semaphores (``sem.mp-*``) come and
    go there, so those count only while this process maps them.
    """
    try:
        names = set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            mapped = {line.rsplit("/", 1)[-1].strip() for line in f if "/dev/shm/" in line}
    except OSError:
        mapped = set()
    return {n for n in names if not n.startswith("sem.mp-") or n in mapped}


def _fd_targets() -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return sorted(out)


class TrialCheck:
    """What must hold after every trial (issue 8): taken against the state at test start.

    * no child process left 5 s after the trial (other than those alive at the start);
    * no new file in ``/dev/shm``;
    * no partial or wrong file under a final name in the given cache directories;
    * open file descriptors back within +-2 of the start;
    * the given ledger event recorded.
    """

    def __init__(self) -> None:
        import fsspec.asyn

        fsspec.asyn.get_loop()  # fsspec's process-wide IO loop (3 fds) is not a per-trial leak
        gc.collect()
        self._me = psutil.Process()
        self._children = {p.pid for p in self._me.children(recursive=True)}
        self._shm = _shm()
        self._fds = _fds()
        self._fd_targets = _fd_targets()

    def __call__(self, *, caches: Iterable[tuple[str | os.PathLike[str], Manifest]] = (),
                 ledger: str | os.PathLike[str] | None = None,
                 events: Iterable[str] = ()) -> None:
        deadline = time.monotonic() + _SETTLE_S
        while True:
            gc.collect()
            left = [p for p in self._me.children(recursive=True)
                    if p.pid not in self._children and _alive(p)]
            shm = sorted(_shm() - self._shm)
            fds = _fds()
            if not left and not shm and abs(fds - self._fds) <= 2:
                break
            if time.monotonic() > deadline:
                for p in left:  # leave nothing behind for the next test, then fail
                    p.kill()
                raise AssertionError(
                    f"after the trial: leftover processes {[(p.pid, p.name()) for p in left]}, "
                    f"new /dev/shm files {shm[:5]}, fds {fds} (start {self._fds}): "
                    f"{sorted(set(_fd_targets()) - set(self._fd_targets))}")
            time.sleep(0.05)
        for cache_dir, manifest in caches:
            check_final_names(cache_dir, manifest)
        kinds = set(events)
        if kinds:
            from stoker.loader.ledger.reader import read_ledger

            seen = {e["kind"] for e in read_ledger(ledger).events}  # type: ignore[arg-type]
            missing = kinds - seen
            assert not missing, f"ledger {ledger} lacks events {sorted(missing)} (has {sorted(seen)})"


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def check_final_names(cache_dir: str | os.PathLike[str], manifest: Manifest) -> None:
    """Every file under a final name in the cache is complete and hashes as the manifest says."""
    shards = Path(cache_dir) / manifest.fingerprint / "shards"
    if not shards.is_dir():
        return
    for f in shards.iterdir():
        i = int(f.name.split(".")[0])
        info = manifest.shards[i]
        digest, size = hash_file(f)
        assert (size, digest) == (info.bytes, info.xxh3_128), \
            f"partial or corrupt file under a final name: {f} ({size} of {info.bytes} bytes)"


@pytest.fixture
def after_trial() -> TrialCheck:
    """``after_trial(caches=[(dir, manifest)], ledger=path, events=["retry"])`` after each trial."""
    return TrialCheck()


@pytest.fixture
def served(fault_server: FaultServer, tmp_path: Path) -> Callable[..., tuple[Path, Manifest]]:
    """``served(rows)`` -> (local dataset dir, manifest) also served by ``fault_server``."""
    from fault_helpers import make_dataset

    counter = iter(range(1000))

    def make(rows: Iterable[int] = (40, 50, 60, 70), **kw: Any) -> tuple[Path, Manifest]:
        root = tmp_path / f"ds{next(counter)}"
        manifest = make_dataset(root, rows, **kw)
        fault_server.put_dir(root)
        return root, manifest

    return make


@pytest.fixture(autouse=True)
def _write_figures() -> Iterator[None]:
    """Write every Figures a test made, also when the test failed (failed trials count)."""
    from fault_helpers import Figures

    Figures.made.clear()
    yield
    for figures in Figures.made:
        figures.write()
    Figures.made.clear()
