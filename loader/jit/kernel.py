"""The one place stoker compiles Numba kernels, with a cache directory that is always writable.

``@njit(cache=True)`` picks a cache locator when a kernel is *defined*; if neither an explicit
``NUMBA_CACHE_DIR``, the package's ``__pycache__`` nor ``~/.cache/numba`` is writable, Numba
raises ``RuntimeError: cannot cache function ...: no locator available`` at import time (see
shared/FIELD-NOTES.md). Read-only site-packages on a cluster node with a read-only ``$HOME`` is
a common case, so :func:`kernel` checks first and, when needed, points ``NUMBA_CACHE_DIR`` at a
writable fallback (``<node cache dir>/numba``, else the system temp dir; see
:mod:`stoker.manifest.locations`), with a warning when a value the
user set had to be replaced. If nothing at all is writable the kernels compile without caching.

Numba itself is imported at the first *use* of a kernel, not when a module defining one is
imported: importing Numba costs ~0.3-0.5 s (LLVM bindings, type registries), and a process that
imports stoker's DataLoader should not pay it before it builds a loader (whose construction
starts Numba in the background, stoker.loader.jit.warmup). :func:`kernel` and
:func:`lazy_intrinsic` return stand-ins; the first use of any of them makes them all (one
``numba.njit`` / ``numba.extending.intrinsic`` each) and rebinds every stoker module's global
that held a stand-in to the real dispatcher, so kernels that call kernels compile as before
and later calls go straight to Numba.
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
import threading
import warnings
from typing import Any, Callable, TypeVar

from stoker.loader.jit import fork_gate
from stoker.manifest import locations

__all__ = ["KernelCacheWarning", "Lazy", "choose_cache_dir", "compiled", "gil_kernel", "kernel",
           "lazy_intrinsic", "made", "materialize"]

F = TypeVar("F", bound=Callable[..., object])


class KernelCacheWarning(RuntimeWarning):
    """Compiled kernels are cached somewhere else than asked, or not cached at all."""


def _writable_dir(path: str) -> bool:
    """Whether ``path`` exists or can be created, and a file can be written inside it."""
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


def _numba_user_cache_dir() -> str:
    from numba.misc.appdirs import AppDirs

    return str(AppDirs(appname="numba", appauthor=False).user_cache_dir)


def _fallback_dirs() -> list[str]:
    return locations.numba_cache_fallbacks()


def choose_cache_dir(env_value: str | None, default_dirs: list[str],
                     fallbacks: list[str]) -> tuple[str | None, str | None]:
    """Decide where compiled kernels go.

    Args:
        env_value: the current ``NUMBA_CACHE_DIR`` (``None`` or ``""`` when unset).
        default_dirs: the directories Numba itself would try (in-tree ``__pycache__``,
            its user-wide cache dir).
        fallbacks: writable candidates to use instead, in order of preference.

    Returns:
        ``(cache_dir, warning)``: ``cache_dir`` is the directory to put in ``NUMBA_CACHE_DIR``
        (``None``: leave Numba's own choice alone; ``""``: nothing is writable, compile without
        a cache); ``warning`` is a message to emit, or ``None``.
    """
    if env_value:
        if _writable_dir(env_value):
            return None, None
        # Any writable directory serves as NUMBA_CACHE_DIR, Numba's own defaults included.
        fallback = next((d for d in fallbacks + default_dirs if _writable_dir(d)), "")
        where = repr(fallback) if fallback else "nowhere (kernels are compiled on every run)"
        return fallback, (f"NUMBA_CACHE_DIR={env_value!r} is not a writable directory; stoker "
                          f"caches its compiled kernels in {where} instead. Point "
                          "NUMBA_CACHE_DIR at a writable directory to silence this warning.")
    if any(_writable_dir(d) for d in default_dirs):
        return None, None
    fallback = next((d for d in fallbacks if _writable_dir(d)), "")
    if fallback:
        return fallback, None
    return "", ("no writable directory for Numba's cache (tried the package's __pycache__, "
                f"{', '.join(default_dirs[1:] + fallbacks)}); stoker's kernels are compiled on "
                "every run. Set NUMBA_CACHE_DIR to a writable directory to cache them.")


@functools.lru_cache(maxsize=None)
def _prepare_cache(source_dir: str) -> bool:
    """Make sure kernels defined in ``source_dir`` can be cached; return whether they can."""
    current = os.environ.get("NUMBA_CACHE_DIR")
    defaults = [os.path.join(source_dir, "__pycache__"), _numba_user_cache_dir()]
    cache_dir, message = choose_cache_dir(current, defaults, _fallback_dirs())
    if message:
        warnings.warn(message, KernelCacheWarning, stacklevel=4)
    if cache_dir:
        os.environ["NUMBA_CACHE_DIR"] = cache_dir
        # Numba read the environment when it was imported; its locators read this attribute.
        import numba

        numba.config.CACHE_DIR = cache_dir
    return cache_dir != ""


class Lazy:
    """A kernel (or intrinsic) whose Numba object is made at its first use.

    Calls and attribute reads (``signatures``, ``py_func``, ...) go to the real object; pickling
    names the defining module and name, as a Numba dispatcher's does.
    """

    def __init__(self, fn: Callable[..., Any], kind: str) -> None:
        self._fn, self._kind, self._real = fn, kind, None
        self.__name__, self.__qualname__ = fn.__name__, fn.__qualname__
        self.__module__, self.__doc__, self.__wrapped__ = fn.__module__, fn.__doc__, fn

    def real(self) -> Any:
        if self._real is None:
            materialize()
        return self._real

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.real()(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real(), name)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_named, (self.__module__, self.__qualname__))

    def __repr__(self) -> str:
        state = "made" if self._real is not None else "not made yet"
        return f"<stoker {self._kind} {self.__module__}.{self.__qualname__} ({state})>"


def made() -> bool:
    """Whether the kernels have been made (Numba imported) in this process."""
    return _made.is_set()


def compiled(fn: Any) -> bool:
    """Whether kernel ``fn`` has a compiled specialisation in this process, without making it:
    a stand-in not made yet has none (asking must not import Numba on the caller's thread)."""
    real = fn._real if isinstance(fn, Lazy) else fn
    return real is not None and bool(real.signatures)


def _named(module: str, qualname: str) -> Any:
    import importlib

    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj.real() if isinstance(obj, Lazy) else obj


_pending: list[Lazy] = []
_made = threading.Event()
_lock = threading.RLock()


def _make(fn: Callable[..., Any], kind: str) -> Any:
    if kind == "intrinsic":
        from numba.extending import intrinsic

        return intrinsic(fn)
    import inspect

    import numba

    cache = _prepare_cache(os.path.dirname(os.path.abspath(inspect.getfile(fn))))
    return numba.njit(cache=cache, nogil=kind == "kernel")(fn)


def materialize() -> None:
    """Import Numba and make every kernel and intrinsic defined so far (idempotent,
    thread-safe); stoker modules' globals that held a stand-in then hold the real object.

    Inside a fork-gate unit: a process worker forked while another thread imports Numba
    would inherit that import's locks held, so forks wait for it (rather than the consumer
    importing Numba before every fork, ~0.2 s that a process using the kernels compiled
    ahead of time never needs)."""
    if _made.is_set():
        return
    _hold_across_forks()
    with fork_gate.unit(), _lock:
        if _made.is_set():
            return
        for lazy in _pending:  # intrinsics were registered first: kernels that use them
            lazy._real = _make(lazy._fn, lazy._kind)  # are typed only when first called
        for name, module in list(sys.modules.items()):
            if name.startswith("stoker.") and module is not None:
                for attr, value in list(vars(module).items()):
                    if isinstance(value, Lazy) and value._real is not None:
                        setattr(module, attr, value._real)
        _pending.clear()
        _made.set()


def _hold_across_forks() -> None:
    """A process forked while another thread makes the kernels would inherit ``_lock`` held
    by a thread it does not have; forks wait for the making to finish instead (registered
    once, at the first making: nothing is registered at import)."""
    with _hooked_lock:
        if _hooked or not hasattr(os, "register_at_fork"):
            return
        os.register_at_fork(before=_lock.acquire, after_in_parent=_lock.release,
                            after_in_child=_lock.release)
        _hooked.append(True)


_hooked: list[bool] = []
_hooked_lock = threading.Lock()


def _define(fn: Callable[..., Any], kind: str) -> Any:
    with _lock:
        if _made.is_set():
            return _make(fn, kind)
        lazy = Lazy(fn, kind)
        _pending.append(lazy)
        return lazy


def kernel(fn: F) -> F:
    """``fn`` compiled with ``@njit(cache=True, nogil=True)`` after securing a cache directory.

    Every stoker kernel goes through here, so the cache fallback and the compile flags live in
    one place. Kernels are compiled lazily, at their first call with a new signature; Numba is
    imported at the first use of any kernel (see the module docstring).
    """
    return _define(fn, "kernel")  # type: ignore[no-any-return]


def gil_kernel(fn: F) -> F:
    """:func:`kernel`, but holding the GIL: for a kernel of a few microseconds called between
    other work of a worker thread. Giving the GIL up and taking it back costs that thread a
    wait while another thread runs Python (a mixture's ``"source"`` column, one call per
    group of 8 batches: 2 thread workers read 7.4 M W1 rows/s with it nogil against 9.1 M for
    the same rows without the column, bench/mixture_bench.py)."""
    return _define(fn, "gil_kernel")  # type: ignore[no-any-return]


def lazy_intrinsic(fn: F) -> F:
    """``numba.extending.intrinsic(fn)``, made with the kernels at their first use."""
    return _define(fn, "intrinsic")  # type: ignore[no-any-return]
