"""Staging for a shuffled mixture: each source's rounds staged on their own, gathered as one.

A mixture whose sources share one reader (:mod:`stoker.loader.read.mixture_union`) reads a
batch's mixture ids in one record gather. While every shard's records fit the records budget,
per-shard records serve them; beyond it a single dataset stages rounds
(:mod:`stoker.loader.read.staging`), and a mixture read its rows from the shards' columns at
random instead: 3 W1 sources of 2 M rows, 0.5 M rows/s against 1.3-1.8 M staged for one
dataset (bench/RESULTS.md, "Mixtures"). So each source is staged as the dataset it is.

Source ``i``'s picks are read in its own pass orders (pick ``j``: pass ``j div N_i``,
position ``j mod N_i``, :mod:`stoker.loader.order.mixture_order`), i.e. exactly the stream a
:class:`~stoker.loader.read.staging.Stager` over that source stages, with the pass in the place
of the epoch. A :class:`Stager` per source does that, its rounds' lookup tables keyed by
mixture ids, and a batch gathers from every held round of every source at once (a round holds
an id's bytes whatever pass staged it).

A batch brings ids, not positions, so the pass its ids of source ``i`` came from is found:
among the passes loader epoch ``e`` draws from source ``i`` (the blend's counts at the epoch's
ends), the first, starting from the one this source's last batch used, under which the ids fall
in at most :attr:`Stager.capacity` consecutive blocks, in order (a batch's picks of one source
are consecutive positions of its pass); or the last blocks of one pass and the first of the
next.

Ranks take every ``W``-th position of the *mixture's* stream, so one rank's picks of a source
are not a partition of its pass order but ~1/W of every partition: each rank stages whole
rounds (every partition's block), W times the rows it reads, and the working set is that of
world size 1 (:func:`stoker.loader.read.mixture_budget.mixture_working_set`). A wrong guess (possible only for a batch holding a few
ids of a source that the epoch draws in more than one pass) costs a round staged for nothing,
never a wrong byte: an id no held round holds is read from the columns, as the reader's other
misses are.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from stoker.loader.fallbacks import note
from stoker.loader.fastpath.plan import FastPlan
from stoker.loader.fastpath.ring import Slot
from stoker.loader.fastpath.rowmajor import Field, RecordLayout
from stoker.loader.order.epoch import OrderOptions
from stoker.loader.order.mixture_kernel import source_of
from stoker.loader.order.mixture_order import source_options
from stoker.loader.read.staging import Stager, gather_rounds, round_table

__all__ = ["MixtureStager"]

_PROBES = 9  # ids of a source's share of a batch whose blocks test a pass


class MixtureStager:
    """The staged rounds of every source of a mixture, read through one reader over all their
    shards (the :class:`Stager` surface that :class:`~stoker.loader.read.arrow.ArrowSource`
    reads: ``opened``, ``layout``, ``fields``, ``gather``, ``close``).

    Args:
        plan: the reader's fast plan.
        options: resolved, shuffled order options (each source's passes use its share of the
            partitions, :func:`~stoker.loader.order.mixture_order.source_options`).
        mixture: the :class:`~stoker.loader.order.mixture.Mixture` (sizes, offsets, blend).
        runs_of: the reader's ``runs_of(shard, firsts, ends, dests)`` over its shards (every
            source's, concatenated in ``mixture.names`` order).
        stage_ahead: as :class:`Stager`'s.
    """

    def __init__(self, plan: FastPlan, options: OrderOptions, mixture: Any,
                 runs_of: Callable[..., Any], stage_ahead: bool = True) -> None:
        self._mixture = mixture
        self._offsets = np.asarray(mixture.offsets, dtype=np.int64)
        self._sizes = np.asarray(mixture.sizes, dtype=np.int64)
        self._stagers: list[Stager] = []
        first_shard = 0
        each = source_options(options, mixture.sizes)
        for i, manifest in enumerate(mixture.manifests):
            rows = np.asarray(manifest.shard_rows, dtype=np.int64)
            starts = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
            self._stagers.append(Stager(
                plan, each[i], 0, 1, rows, manifest.fingerprint, starts,
                lambda s, *runs, base=first_shard: runs_of(base + s, *runs),
                stage_ahead=stage_ahead, id_offset=int(self._offsets[i])))
            first_shard += len(rows)
        self._lock = threading.Lock()
        self._passes: dict[int, list[tuple[int, int]]] = {}  # loader epoch -> passes per source
        # the last round each source's last batch read: (pass, seed, block)
        self._latest: list[tuple[int, int, int] | None] = [None] * len(self._stagers)
        self._tables: dict[tuple[int, ...], tuple[Any, ...]] = {}  # merged lookup tables

    # -- the Stager surface --------------------------------------------------------------------
    def opened(self, batches: Sequence[pa.RecordBatch]) -> None:
        """A shard of any source opened: every source's records take one layout."""
        for s in self._stagers:
            s.opened(batches)

    @property
    def layout(self) -> RecordLayout | None:
        return self._stagers[0].layout

    @property
    def fields(self) -> tuple[Field, ...]:
        return self._stagers[0].fields

    @property
    def staged_rows(self) -> int:
        """Rows copied into rounds so far, every source (statistics)."""
        return sum(s.staged_rows for s in self._stagers)

    @property
    def rounds_staged(self) -> int:
        return sum(s.rounds_staged for s in self._stagers)

    def gather(self, ids: np.ndarray, slot: Slot, epoch: int, seed: int,
               most: int | None = None) -> tuple[dict[str, np.ndarray], np.ndarray] | None:
        """As :meth:`Stager.gather`, for mixture ids of loader epoch ``epoch``; ``most``
        bounds the rounds held per source. Rows whose source's rounds could not be found are
        ``missing`` (read from the columns by the caller), counted as ``"ids_not_staged"``.

        A batch's picks of a source mostly continue in the round its last batch ended in, so
        that round is read first while it is staged; only for sources with rows it lacks are
        the rounds looked up (:meth:`_keys`, ~0.1 ms a source) and the batch read again."""
        src = source_of(ids, self._offsets)
        present = np.flatnonzero(np.bincount(src, minlength=len(self._stagers))).tolist()
        keys = {i: [self._latest[i]] for i in present if self._latest[i] is not None and
                self._latest[i][1] == seed and self._stagers[i].staged(self._latest[i])}
        got = self._read(ids, slot, keys) if len(keys) == len(present) else None
        if got is None or len(got[1]):
            lacking = set(present) - set(keys) if got is None else \
                set(np.unique(src[got[1]]).tolist())
            for i in sorted(lacking):
                local = ids[src == i] - self._offsets[i]
                found = self._keys(i, local, epoch, seed)
                if found is None:
                    note("ids_not_staged", f"mixture source {self._mixture.names[i]!r}: "
                                           f"{len(local)} samples of a batch of loader epoch "
                                           f"{epoch} fit no staged rounds of its passes")
                    keys.pop(i, None)
                elif most is not None and len(found) > most:
                    return None
                else:
                    keys[i] = found
            got = self._read(ids, slot, keys)
            if got is None:
                return {}, np.arange(len(ids), dtype=np.int64)
        for i, own in keys.items():
            s = self._stagers[i]
            self._latest[i] = own[-1]
            s.stage_next(s.order(own[-1][0], seed), own[-1][2], set(own))
        return got

    def _read(self, ids: np.ndarray, slot: Slot, keys: dict[int, list[tuple[int, int, int]]]
              ) -> tuple[dict[str, np.ndarray], np.ndarray] | None:
        """The batch from the rounds ``keys`` of each source, held meanwhile (sources in
        ascending order, so two readers never wait on each other); ``None`` without rounds."""
        layout = self.layout
        held: list[tuple[Stager, list[Any]]] = []
        try:
            for i in sorted(keys):
                s = self._stagers[i]
                held.append((s, s.hold(keys[i])))
            rounds = [r for _, rs in held for r in rs]
            if not rounds or layout is None:
                return None
            return gather_rounds(ids, rounds, slot, layout, self.fields, self._table(rounds))
        finally:
            for s, rs in held:
                s.release(rs)

    def close(self) -> None:
        """Stop every source's staging ahead."""
        for s in self._stagers:
            s.close()
        with self._lock:
            self._tables.clear()

    # -- which rounds ----------------------------------------------------------------------------
    def _pass_range(self, i: int, epoch: int) -> tuple[int, int]:
        """First and last pass of source ``i`` that loader epoch ``epoch`` draws from."""
        with self._lock:
            got = self._passes.get(epoch)
        if got is None:
            length = int(self._offsets[-1])
            blend = self._mixture.blend
            lo, hi = blend.counts(epoch * length), blend.counts((epoch + 1) * length)
            got = [(int(a // n), int(max(a, b - 1) // n))
                   for a, b, n in zip(lo.tolist(), hi.tolist(), self._sizes.tolist())]
            with self._lock:
                self._passes = {**{e: v for e, v in self._passes.items() if e >= epoch - 1},
                                epoch: got}
        return got[i]

    def _keys(self, i: int, local: np.ndarray, epoch: int,
              seed: int) -> list[tuple[int, int, int]] | None:
        """The rounds ``(pass, seed, block)`` of source ``i`` that hold its ids ``local``
        (in pick order) of a batch of loader epoch ``epoch`` (see the module docstring)."""
        s = self._stagers[i]
        lo, hi = self._pass_range(i, epoch)
        latest = self._latest[i]
        last = min(max(latest[0] if latest is not None else lo, lo), hi)
        candidates = list(dict.fromkeys(p for p in (last, last + 1, *range(lo, hi + 1))
                                        if lo <= p <= hi))
        probe = local[np.unique(np.linspace(0, len(local) - 1, min(len(local), _PROBES))
                                .astype(np.int64))]
        cap = s.capacity
        places: dict[int, np.ndarray] = {}

        def blocks(p: int) -> np.ndarray:
            if p not in places:
                places[p] = s.order(p, seed).block_of(probe)
            return places[p]

        for p in candidates:
            block = blocks(p)
            if _in_order(block) and block[-1] - block[0] < cap:
                return [(p, seed, b) for b in range(int(block[0]), int(block[-1]) + 1)]
        for p in candidates:  # the end of pass p, then the start of pass p + 1
            if p + 1 > hi:
                continue
            a, b = blocks(p), blocks(p + 1)
            end = s.order(p, seed).blocks_per_partition() - 1
            for cut in range(1, len(probe)):
                if _in_order(a[:cut]) and _in_order(b[cut:]):
                    keys = [(p, seed, x) for x in range(int(a[0]), end + 1)] + \
                        [(p + 1, seed, x) for x in range(int(b[-1]) + 1)]
                    if len(keys) <= cap:
                        return keys
        return None

    def _table(self, rounds: list[Any]) -> tuple[Any, ...] | None:
        """The merged lookup table of ``rounds`` (consecutive batches hold the same rounds:
        merged once, not per batch); ``None`` for one round (its own table)."""
        if len(rounds) == 1:
            return None
        key = tuple(id(r) for r in rounds)
        with self._lock:
            hit = self._tables.get(key)
        if hit is not None:
            return hit[1]
        table = round_table(rounds)
        with self._lock:
            if len(self._tables) >= 8:
                self._tables.pop(next(iter(self._tables)))
            self._tables[key] = (tuple(rounds), table)  # the rounds kept: ids stay unique
        return table


def _in_order(blocks: np.ndarray) -> bool:
    """Whether ids in ``blocks`` can be consecutive picks of one pass: blocks in order."""
    return bool(np.all(np.diff(blocks) >= 0))
