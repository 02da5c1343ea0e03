"""Loader statistics: how long the consumer waited for data, and how fast batches came."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LoaderStats"]


@dataclass(slots=True)
class LoaderStats:
    """Counters of one loader, updated by the consumer thread only.

    ``wait_s`` is time spent inside ``next()`` waiting for a batch; the data-stall share is
    that time over the wall time since the first batch was requested. ``fallbacks`` counts
    the batches (or shards) that took each named slower path (stoker.loader.fallbacks);
    ``kernel_switches`` how often delivery went from batches read while the kernels were
    compiling (``fallbacks["compiling"]``) to batches from the kernels.
    """

    batches: int = 0
    samples: int = 0
    wait_s: float = 0.0
    first_batch_s: float | None = None
    started: float | None = None
    fallbacks: dict[str, int] = field(default_factory=dict)
    kernel_switches: int = 0
    _compiling: bool = field(default=False, repr=False)
    _last: float | None = field(default=None, repr=False)

    def begin(self) -> None:
        if self.started is None:
            self.started = time.perf_counter()

    def record(self, samples: int, waited: float) -> float:
        """Count one delivered batch; returns the time since the previous one."""
        now = time.perf_counter()
        between = 0.0 if self._last is None else now - self._last
        self._last = now
        if self.first_batch_s is None and self.started is not None:
            self.first_batch_s = now - self.started
        self.batches += 1
        self.samples += samples
        self.wait_s += waited
        return between

    def path(self, compiling: bool) -> None:
        """Note which path served the batch just delivered: ``compiling`` (the pyarrow path
        while the kernels compile, stoker.loader.fastpath.warm) or the kernels; a batch from the
        kernels after one from the pyarrow path counts one switch."""
        if self._compiling and not compiling:
            self.kernel_switches += 1
        self._compiling = compiling

    def as_dict(self) -> dict[str, Any]:
        elapsed = 0.0 if self.started is None else time.perf_counter() - self.started
        return {
            "batches": self.batches,
            "samples": self.samples,
            "elapsed_s": elapsed,
            "wait_s": self.wait_s,
            "data_stall_share": self.wait_s / elapsed if elapsed > 0 else 0.0,
            "batches_per_s": self.batches / elapsed if elapsed > 0 else 0.0,
            "samples_per_s": self.samples / elapsed if elapsed > 0 else 0.0,
            "first_batch_s": self.first_batch_s,
            "fallbacks": dict(self.fallbacks),
            "kernel_switches": self.kernel_switches,
        }
