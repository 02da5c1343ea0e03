"""Kernels compiled ahead of time into one extension module per node, called without Numba.

A process that calls a Numba kernel first pays Numba's start-up: importing it and making the
dispatchers (~0.2 s), then the typing context of the first cached kernel (~0.25 s), all
holding the GIL. A later shuffled run of 2 M W1 rows whose records the node stored takes ~1 s
in all, so that is half of it (bench/RESULTS.md, "Cold start"). The kernels such a run calls,
the order's (:func:`stoker.loader.order.feistel.order_range`) and the records gather
(``stoker.loader.fastpath.record_table._gather``), and those a node's first run over a
dataset calls, the record builders (:func:`stoker.loader.fastpath.rowmajor.build`) and the
column gathers (:data:`stoker.loader.fastpath.kernels_np.ahead`), for outputs of the
:data:`DTYPES`, and those of staged rounds (their copies, ``copy_ranges``, and indexed
Parquet's transpose, ``columns_to_records``: stoker.loader.read.staging,
stoker.loader.read.indexed.row_groups), are compiled here with ``numba.pycc`` into a plain extension module
(:data:`EXPORTS`, one signature each: the one the loader calls them with); importing it
imports no Numba (bench/aot_probe.py). Like the JIT kernels (``nogil``), they give the GIL
up while they run, so thread workers gather at once: ``numba.pycc`` has no option for it,
and :func:`_releasing_gil` sets the compiler flag its wrappers honour. Any other kernel, and
these on a node without the module, stay Numba's JIT kernels.

The module is built once per node, in the background: a process whose JIT kernels loaded from
Numba's cache (the node compiled them before) and found no module starts
``python -m stoker.loader.jit.aot`` in its own session at a low CPU priority
(:func:`build_in_background`; ~11-14 s of one core), which later processes load
(:func:`function`). Its name holds a hash of everything its code depends on (the kernels'
source files, Numba's and Python's versions, the machine), so an upgrade or an edit builds a
new one and an old one is never loaded. It is compiled for a generic CPU of the machine's
architecture, so a cache directory shared by nodes of different CPUs stays usable.
``STOKER_AOT=off`` neither loads nor builds it (the test suite's default: which kernel
served a batch then never depends on a background build); ``STOKER_AOT_DIR`` moves it
(default ``<node cache dir>/aot``).

``numba.pycc`` is pending deprecation in Numba (since 0.57) with a replacement announced; where
a build fails (no pycc, no C compiler) its error is left in ``<module>.failed`` beside the
module's path, no process of the same code tries again, and every kernel stays JIT.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator

import xxhash

from stoker.loader.jit.kernel import compiled
from stoker.manifest import locations

__all__ = ["DTYPES", "EXPORTS", "build", "build_in_background", "directory", "enabled",
           "function", "module_path", "serving", "twin"]

logger = logging.getLogger(__name__)

_FORMAT = "stoker-aot-2"  # 2: the kernels give the GIL up; builders, column gathers
_A = "int64[::1]"
#: an arena's typed views (stoker.loader.fastpath.kernels.arena_views), read-only (a mapping)
_VIEWS = "Tuple((" + ", ".join(
    f"Array({t}, 1, 'C', readonly=True)" for t in ("uint8", "int8", "int16", "int32", "int64",
                                                   "uint16", "uint32", "uint64", "float32",
                                                   "float64")) + "))"
#: the dtypes of record fields and batch outputs the builders and the column gathers are
#: exported for (any other: the JIT kernel, or its NumPy twin)
DTYPES = ("float32", "float64", "int64", "int32")
_K = "stoker.loader.fastpath.kernels"
#: (exported name, defining module, attribute, signature): the kernels a later run of stored
#: records calls; the builders a node's first run calls
#: (:func:`stoker.loader.fastpath.rowmajor.build`) and the column gathers of a batch
#: (:data:`stoker.loader.fastpath.kernels_np.ahead`), ``<kernel>_<dtype>`` by the dtype of
#: the array written; with the argument types the loader passes. A wrapper checks no more
#: than each array's item size, so a caller picks the export matching its arrays' dtypes,
#: dimensions and layouts (:func:`twin`).
EXPORTS = (
    ("order_range", "stoker.loader.order.feistel", "order_range",
     f"int64[::1](int64, int64, int64, int64, int64, int64, int64, uint64[::1], {_A}, {_A})"),
    ("record_gather", "stoker.loader.fastpath.record_table", "_gather",
     f"UniTuple(int64, 2)({_A}, {_A}, int64, {_A}, {_A}, int64, {_A}, {_A}, {_A}, {_A}, {_A}, "
     f"{_A}, int64, {_A})"),
    *((f"copy_ranges_{t}", _K, "copy_ranges",
       f"none({_VIEWS}, int64[:, :, ::1], {_A}, {_A}, {_A}, {_A}, int64, {t}[:, :])")
      for t in DTYPES),
    *((f"copy_list_ranges_{t}", _K, "copy_list_ranges",
       f"none({_VIEWS}, int64[:, ::1], {_A}, {_A}, {_A}, {_A}, {t}[:, :])") for t in DTYPES),
    *((f"gather_fixed_{t}", _K, "gather_fixed",
       f"none({_VIEWS}, int64[:, :, ::1], {_A}, {_A}, {_A}, {t}[:, :])") for t in DTYPES),
    *((f"gather_list_{t}", _K, "gather_list",
       f"none({_VIEWS}, int64[:, ::1], {_A}, {_A}, {_A}, {t}[:, :])") for t in DTYPES),
    ("var_lengths", _K, "var_lengths", f"none({_VIEWS}, int64[:, ::1], {_A}, {_A}, {_A}, {_A})"),
    ("columns_to_records", _K, "columns_to_records",
     f"none({_A}, {_A}, {_A}, int64, int64, int64, int64)"),
)
_LOADER = Path(__file__).resolve().parents[1]  # stoker/loader
#: every source file the exported kernels' code comes from (kernels they call included)
_SOURCES = ("order/feistel.py", "fastpath/record_table.py", "fastpath/kernels.py",
            "jit/search.py", "jit/intrinsics.py", "jit/aot.py")

_FAILED = ".failed"  # beside the module's path: its build failed (the error inside)

_lock = threading.Lock()
_loaded: list[ModuleType | None] = []  # the module (or None), looked for once per process
_spawned: list[bool] = []  # a background build was started by this process


def enabled() -> bool:
    """Whether ahead-of-time kernels are loaded and built (``STOKER_AOT`` is not ``off``)."""
    return os.environ.get("STOKER_AOT", "on").lower() not in ("off", "0", "false", "no")


def directory() -> str:
    """Where the module is: ``$STOKER_AOT_DIR``, else ``<node cache dir>/aot``."""
    return os.environ.get("STOKER_AOT_DIR") or os.path.join(locations.cache_dir(), "aot")


def _key() -> str:
    """A hash of everything the compiled code depends on."""
    h = xxhash.xxh3_128()
    try:
        numba_version = importlib.metadata.version("numba")
    except importlib.metadata.PackageNotFoundError:
        numba_version = "none"
    for part in (_FORMAT, numba_version, sys.version, platform.machine(), repr(EXPORTS)):
        h.update(part.encode() + b"\0")
    for source in _SOURCES:
        h.update((_LOADER / source).read_bytes())
    return h.hexdigest()[:24]


def module_path(root: str | None = None) -> tuple[str, str]:
    """``(module name, file path)`` of the module for this code, in ``root`` (default
    :func:`directory`)."""
    name = f"stoker_aot_{_key()}"
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return name, os.path.join(root or directory(), name + suffix)


def function(name: str) -> Callable[..., Any] | None:
    """The ahead-of-time kernel ``name`` (see :data:`EXPORTS`), or ``None`` when this node has
    no module for this code (or :func:`enabled` is off): the caller uses its JIT kernel."""
    if not _loaded:
        with _lock:
            if not _loaded:
                _loaded.append(_load())
    module = _loaded[0]
    return None if module is None else getattr(module, name, None)


def twin(name: str, *index: Any) -> Callable[..., Any] | None:
    """:func:`function` ``name``, where every array of ``index`` is C-contiguous int64 (what
    the exports' signatures declare for the index and metadata arrays: a wrapper would not
    check it), else ``None``."""
    if not all(a.dtype.kind == "i" and a.dtype.itemsize == 8 and a.flags.c_contiguous
               for a in index):
        return None
    return function(name)


def serving(fn: Any, name: str, *index: Any) -> Any:
    """The kernel to call for JIT kernel ``fn``: ``fn`` once this process compiled or
    loaded it, else its export ``name`` where :func:`twin` allows it (no Numba start-up on
    the caller's thread), else ``fn``. The same bytes either way
    (tests/fastpath/test_aot.py)."""
    return fn if compiled(fn) else twin(name, *index) or fn


def _load() -> ModuleType | None:
    if not enabled():
        return None
    name, path = module_path()
    if not os.path.exists(path):
        return None
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (ImportError, OSError) as exc:  # a torn or foreign file: the JIT kernels serve
        from stoker.loader.fallbacks import note

        note("aot_unusable", f"{path}: {type(exc).__name__}: {exc}")
        return None
    return module


def build(root: str | None = None) -> str | None:
    """Compile :data:`EXPORTS` into ``root`` (default :func:`directory`); returns the module's
    path, or ``None`` when another process is building it. Publishing is atomic (a rename),
    so a process never loads a half-written module."""
    root = root or directory()
    os.makedirs(root, exist_ok=True)
    name, path = module_path(root)
    with open(os.path.join(root, "build.lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        if os.path.exists(path):
            return path
        import warnings

        from stoker.loader.jit.kernel import materialize

        materialize()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pycc's pending deprecation
            from numba.pycc import CC
        work = tempfile.mkdtemp(dir=root, prefix=".build-")
        try:
            cc = CC(name)
            cc.output_dir, cc.verbose = work, False
            for export, module, attr, signature in EXPORTS:
                kernel = getattr(importlib.import_module(module), attr)
                cc.export(export, signature)(kernel.py_func)
            with _releasing_gil():
                cc.compile()
            os.replace(os.path.join(work, os.path.basename(path)), path)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return path


@contextlib.contextmanager
def _releasing_gil() -> Iterator[None]:
    """While pycc compiles: every function's Python wrapper gives the GIL up around the call,
    as ``nogil=True`` makes Numba's own wrappers do. pycc builds its compiler flags with the
    ``Flags`` its module imported and offers no option for this flag, so that name is
    swapped for a subclass setting it, and put back."""
    from numba.pycc import compiler

    plain = compiler.Flags

    class NoGil(plain):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.release_gil = True

    compiler.Flags = NoGil
    try:
        yield
    finally:
        compiler.Flags = plain


def build_in_background() -> bool:
    """Start building the module in a process of its own (its own session, so it finishes
    after this one exits; niced), once per process, when it is enabled and
    missing; whether one was started."""
    if not enabled() or _spawned:
        return False
    root = directory()
    path = module_path(root)[1]
    if os.path.exists(path) or os.path.exists(path + _FAILED):
        return False
    _spawned.append(True)
    try:
        os.makedirs(root, exist_ok=True)
        with open(os.path.join(root, "build.log"), "ab") as log:
            subprocess.Popen([sys.executable, "-m", "stoker.loader.jit.aot", root],
                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True, close_fds=True)
    except OSError as exc:  # a read-only cache: the JIT kernels serve, as before
        logger.info("ahead-of-time kernels are not built in %s: %s", root, exc)
        return False
    logger.info("building ahead-of-time kernels in %s (in the background)", root)
    return True


def _main() -> None:
    """``python -m stoker.loader.jit.aot [DIR]``: build the module (niced)."""
    try:
        os.nice(10)
    except OSError:
        pass
    root = sys.argv[1] if len(sys.argv) > 1 else None
    try:
        path = build(root)
    except Exception as exc:  # no pycc, no C compiler: no process of this code tries again
        Path(module_path(root)[1] + _FAILED).write_text(f"{type(exc).__name__}: {exc}\n")
        raise
    print(path or "another process is building it")


if __name__ == "__main__":
    _main()
