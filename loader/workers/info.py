"""torch's worker contract, in every worker mode: ``get_worker_info()``, seeding, user code.

* Process workers (``worker_mode="process"``) start as torch's do: torch's signal handlers,
  one intra-op thread
  (``torch.set_num_threads(1)``: forked intra-op pools hang), ``random`` / torch / numpy seeded
  from ``base_seed + worker id`` with torch's own numpy seeding, and
  ``torch.utils.data.get_worker_info()`` returning a torch ``WorkerInfo`` whose ``dataset`` is
  the worker's own copy.
* Thread workers share the process, its dataset object and its global generators. The user's
  code (dataset, ``collate_fn``, ``transform``, ``worker_init_fn``) runs one call at a time
  under a process-wide lock, with ``get_worker_info()`` showing the running worker's
  ``WorkerInfo`` (``worker_method="thread"``) and the generators seeded for the call and
  restored afterwards. stoker's own reading (Arrow, Numba kernels) runs outside the lock, in
  parallel.
* In the main process (``num_workers=0``) ``get_worker_info()`` is ``None``, as in torch.

``WorkerInfo.seed`` is torch's per-worker seed (``base_seed + id``, with ``base_seed`` derived
from the loader's seed and the epoch the workers started in). With per-sample seeding on (the
default, see ``stoker.loader.workers.sample_rng``) each dataset call is re-seeded from its sample, so
the worker seed only matters to code outside those calls (``worker_init_fn``, the ``__iter__``
of an ``IterableDataset``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import threading
from typing import Any, Iterator

import numpy as np
import torch
import torch.utils.data._utils.worker as torch_worker
from torch.utils.data._utils import signal_handling

from stoker.loader.workers.sample_rng import RngState, seed_all

__all__ = ["UserCall", "WorkerContext", "in_process_worker", "user_code"]

_local = threading.local()  # .context: the WorkerContext of a thread worker
_state = {"process_worker": False, "lock": threading.RLock()}
_HAS_METHOD = any(f.name == "worker_method" for f in dataclasses.fields(torch_worker.WorkerInfo)) \
    if dataclasses.is_dataclass(torch_worker.WorkerInfo) else False


def in_process_worker() -> bool:
    """True inside a stoker worker process."""
    return bool(_state["process_worker"])


class WorkerContext:
    """One worker's identity: its torch ``WorkerInfo`` and how its user code is entered."""

    def __init__(self, worker_id: int, num_workers: int, base_seed: int, dataset: Any,
                 mode: str) -> None:
        self.id, self.mode = worker_id, mode
        self.seed = (base_seed + worker_id) % 2**64
        self.base_seed = base_seed
        extra = {"worker_method": "thread" if mode == "thread" else "multiprocessing"} \
            if _HAS_METHOD else {}
        self.info = torch_worker.WorkerInfo(id=worker_id, num_workers=num_workers,
                                            seed=self.seed, dataset=dataset, **extra)

    def enter(self) -> None:
        """Called first thing in the worker (its thread or its process); nothing in a
        ``"reader"`` thread (no user code runs there: ``WorkerOptions.read_ahead``)."""
        if self.mode == "reader":
            return
        if self.mode == "thread":
            _local.context = self
            return
        _state["process_worker"] = True
        # torch's: SIGSEGV/SIGBUS/SIGFPE/SIGTERM print and die, whatever handler the parent
        # had installed (a forked Python SIGTERM handler, e.g. Lightning's, would ignore the
        # terminate() of a shutdown and hang it)
        signal_handling._set_worker_signal_handlers()
        _state["lock"] = threading.RLock()  # a fork may have copied it held by another thread
        torch.set_num_threads(1)
        random.seed(self.seed)
        torch.manual_seed(self.seed)
        np.random.seed(torch_worker._generate_state(self.base_seed, self.id))
        torch_worker._worker_info = self.info


class UserCall:
    """Handed to the code inside :func:`user_code`: seeds the generators before each call."""

    __slots__ = ("seeded",)

    def __init__(self, seeded: bool) -> None:
        self.seeded = seeded

    def seed(self, seed: int) -> None:
        if self.seeded:
            seed_all(seed)


_SEEDED, _UNSEEDED = UserCall(True), UserCall(False)


@contextlib.contextmanager
def user_code(seeded: bool = True) -> Iterator[UserCall]:
    """Run user code as the current worker; ``call.seed(s)`` seeds the generators (if
    ``seeded``) before each call made inside.

    In a process worker this only seeds. Elsewhere (thread workers, the main process) the
    generators and ``get_worker_info()`` are shared by the whole process, so the block holds
    the process-wide user lock, a thread worker's ``WorkerInfo`` is visible meanwhile, and a
    seeded block puts the generators' state back when it ends (an unseeded one leaves the
    draws in the shared stream, as torch's ``num_workers=0`` does).
    """
    call = _SEEDED if seeded else _UNSEEDED
    if _state["process_worker"]:
        yield call
        return
    context: WorkerContext | None = getattr(_local, "context", None)
    with _state["lock"]:
        saved = RngState() if seeded else None
        before = torch_worker._worker_info
        if context is not None:
            torch_worker._worker_info = context.info
        try:
            yield call
        finally:
            torch_worker._worker_info = before
            if saved is not None:
                saved.restore()
