"""Background compilation of Numba kernels: warm-up threads, once per key and process.

A fresh process pays ~0.3-0.5 s before its first batch for Numba's one-time start-up and for
loading each cached kernel (shared/FIELD-NOTES.md); on a node whose Numba cache is empty,
compiling stoker's kernels takes 25-60 s of one core. That work depends only on the kernels'
argument *types*, so it can run in a daemon thread while the user builds a model. This module
runs those threads (:func:`spawn`) and answers whether they are still working (:func:`warming`,
:func:`finished`); *what* a warm-up compiles belongs to the layer that owns the kernels
(the fast path's plans and the order: :mod:`stoker.loader.fastpath.warm`), since jit is the
bottom layer and imports nothing above it.

Nothing happens at import: the at-fork and exit hooks below are installed with the first
warm-up thread (the first :func:`spawn`, e.g. the first DataLoader's
:func:`stoker.loader.fastpath.warm.prime`).

Fork safety: a child forked while a thread holds Numba's compiler lock would deadlock on its
first kernel call, so an at-fork hook holds that lock across ``fork`` (waiting for the kernel
being compiled, not for the whole warm-up); a child whose parent was still warming up starts
its own warm-up at its first batch (kernels the parent already compiled load from the cache).
At exit, the hook waits for the warm-ups: a thread stopped inside Numba can crash the
interpreter.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Any, Callable

__all__ = ["compile_errors", "finished", "first_call", "kernels_wait", "spawn", "started", "wait",
           "warming"]

_lock = threading.Lock()
_threads: list[threading.Thread] = []
_done: set[tuple[str, ...]] = set()  # warm-ups started in this process
_finished: set[tuple[str, ...]] = set()  # ... and finished (kernels compiled or loaded)
_first: set[str] = set()  # see first_call
_hooked: list[bool] = []  # the hooks are installed (see _install_hooks)
_held_for_fork: list[Any] = []


def spawn(key: tuple[str, ...], target: Callable[..., None], *args: Any) -> None:
    """Run ``target(*args)`` in a daemon warm-up thread, once per ``key`` and process.

    The warm-up counts as *finished* however it ends: after a failure the kernels compile at
    their first call (or raise there), as without a warm-up.
    """
    with _lock:
        if key in _done:
            return
        _install_hooks()
        _done.add(key)
        thread = threading.Thread(target=_finishing, args=(key, target, args),
                                  name="stoker-warmup", daemon=True)
        _threads[:] = [t for t in _threads if t.is_alive()] + [thread]
    thread.start()


def started(key: tuple[str, ...]) -> bool:
    """Whether the warm-up ``key`` was started in this process (a forked child forgets the
    ones its parent had not finished)."""
    return key in _done


def finished(key: tuple[str, ...]) -> bool:
    """Whether the warm-up ``key`` has finished in this process."""
    return key in _finished


def wait() -> None:
    """Block until every warm-up started in this process has finished."""
    with _lock:
        threads = list(_threads)
    for t in threads:
        if t is not threading.current_thread():
            t.join()


def kernels_wait() -> bool:
    """``STOKER_COLD_START=wait``: batches compile the kernels they need themselves, never
    served by the NumPy twins meanwhile (the test suite: which path served a batch then never
    depends on timing)."""
    return os.environ.get("STOKER_COLD_START", "fallback") == "wait"


def warming() -> bool:
    """Whether a warm-up thread is still compiling or loading kernels in this process (and
    not :func:`kernels_wait`): NumPy twins may serve the order meanwhile."""
    if kernels_wait():
        return False
    return any(t.is_alive() for t in _threads)


def first_call(name: str) -> bool:
    """True for the first call of ``name`` in this process if a warm-up thread is still
    loading kernels: that call (the first batch's order or gather) may use its NumPy twin
    instead of waiting for Numba's start-up. Later calls wait for the kernels: NumPy batches
    competing with the warm-up for the GIL measured slower overall (bench/RESULTS.md)."""
    if name in _first:  # every call but a process's first: no lock
        return False
    with _lock:
        if name in _first:
            return False
        _first.add(name)
        return any(t.is_alive() for t in _threads)


def compile_errors() -> tuple[type[BaseException], ...]:
    """What compiling or loading a kernel on synthetic inputs may raise: a warm-up that hits
    one of these is only a lost head start (the first batch compiles, or raises, itself);
    anything else is a bug and propagates (the warm-up thread then prints it)."""
    from numba.core.errors import NumbaError

    return (NumbaError, ImportError, OSError, MemoryError, RuntimeError, ValueError, TypeError)


def _finishing(key: tuple[str, ...], target: Callable[..., None], args: tuple[Any, ...]) -> None:
    try:
        target(*args)
    finally:
        _finished.add(key)


def _install_hooks() -> None:
    """Install the at-fork and exit hooks, once per process (called under ``_lock``, before
    the first warm-up thread starts)."""
    if _hooked:
        return
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                            after_in_child=_after_fork_in_child)
    atexit.register(wait)  # a thread stopped inside Numba at interpreter exit can crash it
    _hooked.append(True)


def _compiler_lock() -> Any:
    """Numba's global compiler lock, or ``None`` while Numba is not imported."""
    module = sys.modules.get("numba.core.compiler_lock")
    return getattr(module, "global_compiler_lock", None)


def _before_fork() -> None:
    lock = _compiler_lock()
    if lock is not None:
        lock.acquire()  # a compile in progress finishes first; no new one starts
        _held_for_fork.append(lock)


def _after_fork_in_parent() -> None:
    while _held_for_fork:
        _held_for_fork.pop().release()


def _after_fork_in_child() -> None:
    _after_fork_in_parent()
    # the warm-up threads did not survive the fork: unfinished plans start again (lazily,
    # at the child's first batch, see stoker.loader.fastpath.warm.ready)
    _threads.clear()
    _done.intersection_update(_finished)
