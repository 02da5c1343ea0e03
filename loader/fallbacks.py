"""Named fallbacks: the one way a reader may take a slower path instead of failing.

A fallback is never silent. Where it happens, :func:`note` records its *reason* (one of
:data:`REASONS`) and a detail naming the shard or batch; the task that was running collects
what it noted (:func:`collecting`), the loader's consumer adds the counts to
``loader.stats.fallbacks``, writes a ``"fallback"`` ledger event the first time a reason
appears and a summary at the end of the epoch, and logs each reason once (see
:class:`FallbackAccount`). Everything that is not a named fallback propagates as a typed error.

A note made outside any task (a background thread building row-major records) waits in this
process until the next task here collects it, so worker processes report theirs too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator

__all__ = ["REASONS", "FallbackAccount", "Noted", "collecting", "drain", "note"]

logger = logging.getLogger("stoker.loader")

REASONS = {
    "not_zero_copy": "a shard's buffers are not inside its memory map (a compressed shard): "
                     "its rows are read with pyarrow instead of the Numba kernels",
    "row_major_failed": "a shard's row-major records could not be built or mapped: its "
                        "batches use the column kernels",
    "records_mismatch": "a shard's (or an indexed row group's) stored row-major records "
                        "differed from its own columns at a checked row (a stale, buggy or "
                        "tampered file, its checksum rewritten with it): the file was deleted "
                        "and the records rebuilt from the shard (a worker that does not build "
                        "reads the shard's columns instead); no record of that file was served",
    "records_not_saved": "a shard's row-major records did not fit under the node cache's byte "
                         "limit beside its shards (shards stay; record files go first), or "
                         "writing them would have left the disk less than 10 % free: they "
                         "were not saved, so they stay in the memory of the process that "
                         "built them, and other processes build them again or read the "
                         "shard's columns; an indexed row group's records are also not saved "
                         "while 8 saves already wait for the disk (a later run saves them)",
    "index_unstaged": "a list column of indexed Parquet has another width in some row group: "
                      "those batches are read with pyarrow instead of from staged records",
    "ids_not_staged": "a batch of shuffled samples whose ids lie in more rounds than a rank "
                      "stages at once (ids a caller chose, not a batch of the loader's order): "
                      "read from the shards' columns instead of staged records",
    "mixture_unstaged": "a shuffled mixture whose row-major records exceed the records budget "
                        "(min(2 GiB, RAM / 4)) and whose sources cannot share one reader (remote "
                        "or of other schemas): those stage no rounds, so the rows of the shards "
                        "left without records are read from their columns, several times "
                        "slower than a staged dataset of the same rows; "
                        "ReadOptions(row_major=True) lifts the budget where memory allows",
    "compiling": "the Numba kernels were still being compiled (a fresh node) or loaded (a "
                 "fresh process): the batch was read with pyarrow, the same bytes the kernels "
                 "write; batches switch to the kernels once they are ready (counted in "
                 "loader.stats.kernel_switches)",
    "aot_unusable": "the node's kernels compiled ahead of time (stoker.loader.jit.aot) could "
                    "not be loaded (a torn or foreign file): the process uses the Numba JIT "
                    "kernels, the same bytes",
    "fork_busy": "a worker process was forked while a background thread (records, staging, "
                 "warm-up) was still inside a unit of work after the fork gate's wait "
                 "(stoker.loader.jit.fork_gate): the worker may block on a lock that thread "
                 "held; the loader's timeout then names it",
    "no_readahead": "a staged round could not advise the kernel of the shard pages it reads "
                    "(no madvise here, or it was refused): those pages fault in one by one, "
                    "with the kernel's read-around (stoker.loader.fastpath.advise)",
    "no_populate": "a records build could not ask the kernel for a range's pages at once "
                   "(madvise MADV_POPULATE_WRITE, Linux 5.14 and later), or a mapped record "
                   "file for all of its pages (MADV_POPULATE_READ): they fault in one by one "
                   "as the build writes them or the checksum reads them, the same bytes "
                   "(stoker.loader.fastpath.ring, stoker.loader.fastpath.record_store)",
    "no_huge_pages": "the kernel refused to map a record file in huge pages (madvise "
                     "MADV_HUGEPAGE: no transparent huge pages here): shuffled batches read its "
                     "records through 4 KB pages, the same bytes, slower the larger the file "
                     "(1.9x at 1.5 GB: stoker.loader.fastpath.record_store)",
    "records_buffered": "the records directory's filesystem (some FUSE and network filesystems) "
                        "or the platform refused direct I/O (O_DIRECT): a record file was "
                        "written through the page cache, a copy into fresh page-cache pages "
                        "while the first run's batches wait for the same cores "
                        "(stoker.loader.fastpath.record_store.RecordStore.save)",
    "records_not_warmed": "the low-priority helper process that reads a record file written "
                          "past the page cache into it could not start, or failed: the next "
                          "process that maps the file reads it from the disk, the same bytes "
                          "(stoker.loader.fastpath.record_store)",
    "no_io_priority": "a records builder thread could not put its disk reads in the idle I/O "
                      "class (ioprio_set refused): it reads at the loader's own priority "
                      "(stoker.loader.fastpath.shard_records.idle_io)",
    "group_retried": "several batches read by one record gather (a thread worker's group, "
                     "stoker.loader.read.arrow.ArrowSource.fetch_group) raised: each batch was "
                     "read again on its own, so a failure is raised at its own batch",
    "batch_copied": "the caller held batches from more slots of one worker process's "
                    "shared-memory ring at once than it lends (stoker.loader.workers.transport"
                    ".LEASES slots, a group task's batches share one; e.g. list(loader)): "
                    "further batches were copied out of the ring instead of handed out in "
                    "place, ~65 us of CPU per 400 KB batch",
    "open_ahead_failed": "the loader's own process could not open a shard ahead for its "
                         "process workers (to build the shard's records for them): nothing "
                         "else changes; the worker that reads the shard's rows meets the same "
                         "error at that batch and raises it there",
    "ring_full": "a worker process found every slot of its shared-memory ring in use (a bug in "
                 "the hand-over's limits): the batch was pickled through its pipe instead",
    "warmup_skipped": "the kernels could not be compiled ahead of the first batch: the first "
                      "batch compiles them (and raises if they cannot be)",
}
"""Every fallback there is, with what it costs (shown in logs and ledger events)."""

# reason -> [count, first detail]
Noted = dict[str, list[Any]]

_local = threading.local()
_pending: Noted = {}
_pending_lock = threading.Lock()
_hooked: list[bool] = []  # the at-fork hook below is installed (with the first pending note)


def _forget_in_child() -> None:
    # a forked worker reports its own notes; its parent's pending ones stay the parent's
    global _pending_lock
    _pending.clear()
    _pending_lock = threading.Lock()


def note(reason: str, detail: str) -> None:
    """Record one fallback of ``reason`` (a key of :data:`REASONS`); ``detail`` names the
    shard or batch. Cheap: a dict update."""
    if reason not in REASONS:
        raise ValueError(f"unknown fallback reason {reason!r}; add it to "
                         f"stoker.loader.fallbacks.REASONS (have {sorted(REASONS)})")
    target = getattr(_local, "noted", None)
    if target is None:
        with _pending_lock:
            if not _hooked and hasattr(os, "register_at_fork"):
                os.register_at_fork(after_in_child=_forget_in_child)
                _hooked.append(True)
            _add(_pending, reason, 1, detail)
        return
    _add(target, reason, 1, detail)


def _add(into: Noted, reason: str, count: int, detail: str) -> None:
    entry = into.get(reason)
    if entry is None:
        into[reason] = [count, detail]
    else:
        entry[0] += count


def drain() -> Noted:
    """Take the process's pending notes (made outside any :func:`collecting` block, e.g. by
    the consumer while it forked a worker process): the consumer counts them itself, since
    with worker processes no block of its own would ever collect them."""
    if not _pending:
        return {}
    with _pending_lock:
        noted = {reason: list(entry) for reason, entry in _pending.items()}
        _pending.clear()
    return noted


@contextlib.contextmanager
def collecting() -> Iterator[Noted]:
    """``with collecting() as noted:`` gathers this thread's notes (and the process's pending
    ones) made inside the block into ``noted``."""
    noted: Noted = {}
    if _pending:
        with _pending_lock:
            for reason, (count, detail) in _pending.items():
                _add(noted, reason, count, detail)
            _pending.clear()
    outer = getattr(_local, "noted", None)
    _local.noted = noted
    try:
        yield noted
    finally:
        _local.noted = outer


@dataclass(slots=True)
class FallbackAccount:
    """The consumer's side: counts into ``stats``, ledger events, one log line per reason."""

    counts: dict[str, int] = field(default_factory=dict)
    _logged: set[str] = field(default_factory=set)

    def add(self, noted: Noted, ledger: Any, epoch: int, step: int) -> None:
        for reason, (count, detail) in noted.items():
            first = reason not in self.counts
            self.counts[reason] = self.counts.get(reason, 0) + int(count)
            if first and ledger is not None:
                ledger.event("fallback", reason=reason, epoch=epoch, step=step, detail=detail,
                             why=REASONS[reason])
            if reason not in self._logged:
                self._logged.add(reason)
                # a cold start is expected once per node, not a problem to warn about
                (logger.info if reason == "compiling" else logger.warning)("fallback %s (first at epoch %d step %d: %s): %s; counted in "
                               "loader.stats.fallbacks", reason, epoch, step, detail,
                               REASONS[reason])
