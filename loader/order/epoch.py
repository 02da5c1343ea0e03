"""The sample order of an epoch: a pure function of (fingerprint, seed, epoch, options).

Algorithm (``stoker.order/1``), see shared/DESIGN.md "Order":

1. Shards are permuted by sorting SplitMix64 keys drawn from ``derive_seed(fp, seed, epoch,
   SHARDS)``; concatenating them gives a stream ``S`` of the ``N`` samples. In ``"fixed"`` mode
   this draw uses no epoch (``epoch=-1``) instead, so partitions keep their shards.
2. ``S`` is cut into ``P`` balanced contiguous partitions: partition ``p`` starts at
   ``b_p = p*(N//P) + min(p, N%P)`` and holds ``N//P + (p < N%P)`` samples, which is exactly
   the number of positions ``k`` in ``[0, N)`` with ``k % P == p``. Cutting makes a table of
   *pieces* (shards, or parts of a shard that straddles a partition boundary). In ``"fixed"``
   mode each partition's pieces are then re-ordered per epoch.
3. Partition ``p``'s element ``j`` is ``S[b_p + K*(j//K) + f(j % K)]`` where ``f`` is a Feistel
   bijection of the block (the last block of a partition is shorter) keyed by ``(p, j//K)``.
4. ``O[k]`` = partition ``k % P``, element ``k // P``. Rank ``r`` of ``W`` (``W`` divides
   ``P``) takes the ``k`` with ``k % W == r``, i.e. exactly the partitions ``p % W == r``.

Memory and setup are O(shards + P); ``O[k]`` costs O(log pieces) and needs no shared state.
With ``shuffle=False``, ``O[k] = k`` (``P`` recorded as 1), so rank ``r`` of ``W`` reads the
``k`` with ``k % W == r`` exactly like torch's ``DistributedSampler(shuffle=False)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stoker.loader.jit import aot, warmup
from stoker.loader.jit.kernel import compiled
from stoker.loader.jit.search import distinct
from stoker.loader.order import feistel as _k
from stoker.loader.order.options import (ORDER_ALGORITHM, OrderError, OrderOptions, check_int,
                                         check_rank, check_rows, check_window)
from stoker.loader.order.seed import derive_seed
from stoker.loader.order.windows import Ahead, Windows

# ORDER_ALGORITHM, OrderError, OrderOptions and derive_seed live in their own modules; they are
# re-exported here, where callers have always imported them from
__all__ = ["ORDER_ALGORITHM", "EpochOrder", "OrderError", "OrderOptions", "derive_seed", "locate"]

_SALT_SHARDS = 1      # shard permutation
_SALT_BLOCKS = 2      # per-partition block keys
_SALT_PIECES = 3      # per-epoch piece order inside partitions ("fixed" mode)
_NO_EPOCH = -1        # the epoch argument of epoch-independent draws


def locate(shard_rows_cumsum: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(shard index, row within shard) of global sample ids, vectorised.

    Args:
        shard_rows_cumsum: ``np.cumsum(shard_rows)`` (inclusive, one entry per shard, in
            manifest order); empty shards are fine.
        ids: global sample ids in ``[0, N)``.
    """
    cum = np.asarray(shard_rows_cumsum, dtype=np.int64)
    ids = np.asarray(ids, dtype=np.int64)
    total = int(cum[-1]) if cum.size else 0
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= total):
        raise OrderError(f"sample ids must be in [0, {total}), got values in "
                         f"[{int(ids.min())}, {int(ids.max())}].")
    shard = np.searchsorted(cum, ids, side="right")
    start = np.where(shard > 0, cum[np.maximum(shard - 1, 0)], 0)
    return shard.astype(np.int64), ids - start


class EpochOrder:
    """``O[k]`` for ``k`` in ``[0, N)``: the global sample order of one epoch, random access.

    Construction costs O(shards + P) time and memory, never O(N); any position can be
    evaluated independently, so workers share nothing and resume state is just ``k``. The
    object is immutable after construction and picklable; its kernels release the GIL, so
    threads may query one instance concurrently.

    Attributes:
        num_samples: ``N``, the sum of ``shard_rows``.
        options: the resolved options (``block_size`` filled in; see :meth:`OrderOptions.resolve`).
        fingerprint, seed, epoch: the inputs the order is a pure function of (with ``options``).
    """

    def __init__(self, shard_rows: np.ndarray, fingerprint: str, seed: int, epoch: int,
                 options: OrderOptions) -> None:
        if not isinstance(options, OrderOptions):
            raise OrderError(f"options must be an OrderOptions, got {type(options).__name__}.")
        rows = check_rows(shard_rows)
        self.options = options.resolve(rows)
        self.fingerprint = fingerprint
        self.seed = check_int("seed", seed)
        self.epoch = check_int("epoch", epoch, minimum=0)
        derive_seed(fingerprint, self.seed, self.epoch)  # validates the fingerprint early
        self.num_samples = int(rows.sum())
        self._rows = rows
        self._cumsum = np.cumsum(rows)
        P, N = self.options.partitions, self.num_samples
        self._q, self._rem = N // P, N % P
        if self.options.shuffle:
            self._build_pieces()

    #: compute ids with the NumPy twins only, never Numba (a source whose batches need no
    #: kernels: ArrowSource.numba_free); the same ids either way (tests/order)
    numpy_only = False

    def __repr__(self) -> str:
        return (f"EpochOrder(num_samples={self.num_samples}, shards={len(self._rows)}, "
                f"epoch={self.epoch}, seed={self.seed}, options={self.options})")

    # -- construction -------------------------------------------------------------------------
    def _key(self, epoch: int, salt: int) -> np.uint64:
        return np.uint64(derive_seed(self.fingerprint, self.seed, epoch, salt))

    def _build_pieces(self) -> None:
        fixed = self.options.partition_mode == "fixed"
        draw_epoch = _NO_EPOCH if fixed else self.epoch
        keys = _k.hash_keys(self._key(draw_epoch, _SALT_SHARDS), len(self._rows))
        perm = np.argsort(keys, kind="stable")
        perm = perm[self._rows[perm] > 0]
        shard_pos = (np.cumsum(self._rows[perm]) - self._rows[perm]).astype(np.int64)
        P, q, rem, N = self.options.partitions, self._q, self._rem, self.num_samples
        pstarts = np.arange(P, dtype=np.int64) * q + np.minimum(np.arange(P), rem)
        cuts = distinct(np.concatenate([shard_pos, pstarts[pstarts < N]]))
        j = np.searchsorted(shard_pos, cuts, side="right") - 1
        shard = perm[j].astype(np.int64)
        gid = (self._cumsum[shard] - self._rows[shard]) + (cuts - shard_pos[j])
        length = np.diff(np.append(cuts, N))
        part = np.searchsorted(pstarts, cuts, side="right") - 1
        if fixed and len(cuts):
            # Same pieces in every partition each epoch; only their order inside it changes.
            pkeys = _k.hash_keys(self._key(self.epoch, _SALT_PIECES), len(cuts))
            o = np.lexsort((pkeys, part))
            shard, gid, length, part = shard[o], gid[o], length[o], part[o]
            cuts = np.cumsum(length) - length
        self._piece_pos = cuts
        self._piece_gid = gid.astype(np.int64)
        self._piece_shard = shard
        self._piece_part = part.astype(np.int64)
        self._pkeys = _k.hash_keys(self._key(self.epoch, _SALT_BLOCKS), P)

    def _kernel_args(self) -> tuple[Any, ...]:
        o = self.options
        return (np.int64(o.partitions), np.int64(o.block_size), np.int64(self._q),
                np.int64(self._rem), self._pkeys, self._piece_pos, self._piece_gid)

    # -- positions ----------------------------------------------------------------------------
    def _check_window(self, start: int, stop: int) -> tuple[int, int]:
        return check_window(check_int("start", start), check_int("stop", stop),
                            self.num_samples)

    def _check_rank(self, rank: int, world_size: int) -> tuple[int, int]:
        world_size = check_int("world_size", world_size, minimum=1)
        rank = check_int("rank", rank, minimum=0)
        check_rank(rank, world_size)
        P = self.options.partitions
        if self.options.shuffle and P % world_size:
            raise OrderError(f"world_size {world_size} does not divide partitions={P}; ranks own "
                             f"whole partitions. Use a world size dividing {P}, or create the "
                             f"loader with partitions a multiple of {world_size}.")
        return rank, world_size

    def _range(self, start: int, stop: int, step: int) -> np.ndarray:
        if not self.options.shuffle:
            return np.arange(start, stop, step, dtype=np.int64)
        if stop <= start:
            return np.empty(0, dtype=np.int64)
        # compiled ahead of time (stoker.loader.jit.aot): no Numba at all
        loaded = compiled(_k.order_range)
        ahead = None if loaded else aot.function("order_range")
        if ahead is None and (self.numpy_only or (warmup.warming() and not loaded)):
            return _k.order_at_np(np.arange(start, stop, step, dtype=np.int64),
                                  *self._kernel_args())
        return (ahead or _k.order_range)(np.int64(start), np.int64(stop), np.int64(step),
                                         *self._kernel_args())

    def ids(self, start: int, stop: int) -> np.ndarray:
        """int64 global sample ids ``O[start:stop]`` (a global id indexes the concatenation of
        the shards in manifest order)."""
        start, stop = self._check_window(start, stop)
        return self._range(start, stop, 1)

    def ids_at(self, ks: np.ndarray) -> np.ndarray:
        """``O[k]`` for arbitrary int64 positions ``ks`` (any shape; result has the same)."""
        ks = np.asarray(ks)
        if ks.size and ks.dtype.kind not in "iu":
            raise OrderError(f"positions must be integers, got dtype {ks.dtype}.")
        flat = ks.astype(np.int64, copy=False).ravel()
        if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= self.num_samples):
            raise OrderError(f"positions must be in [0, {self.num_samples}), got values in "
                             f"[{int(flat.min())}, {int(flat.max())}].")
        if not self.options.shuffle or not flat.size:
            return flat.copy().reshape(ks.shape)
        at = _k.order_at_np if self.numpy_only else _k.order_at
        return at(np.ascontiguousarray(flat), *self._kernel_args()).reshape(ks.shape)

    def rank_ids(self, start: int, stop: int, rank: int, world_size: int) -> np.ndarray:
        """``[O[k] for k in range(start, stop) if k % world_size == rank]``."""
        start, stop = self._check_window(start, stop)
        rank, world_size = self._check_rank(rank, world_size)
        first = start + (rank - start) % world_size
        return self._range(first, stop, world_size)

    def windows(self, ahead: Ahead | None = None) -> "EpochOrder | Windows":
        """What the loader reads consecutive batch windows from: an object with
        :meth:`rank_ids`. Shuffled, :class:`~stoker.loader.order.windows.Windows` computing
        chunks of positions at once (a batch alone pays the kernel's per-call setup of
        every partition's block for few ids), the next ones by ``ahead`` when given
        (:meth:`~stoker.loader.order.windows.ChunkThread.ahead`); in natural order, this
        order itself."""
        if not self.options.shuffle:
            return self
        return Windows(self._range, self.num_samples, ahead=ahead)

    def shard_sequence(self, start: int, stop: int, rank: int = 0,
                       world_size: int = 1) -> np.ndarray:
        """Shards (manifest indices) in the order this rank first reads them in ``[start, stop)``.

        No repeats; exactly the shards holding ``rank_ids(start, stop, rank, world_size)``.
        A cache wants :meth:`shard_uses` (every use, with repeats) instead.
        """
        shards, _, _ = self.shard_uses(start, stop, rank, world_size)
        _, first = np.unique(shards, return_index=True)
        return shards[np.sort(first)].astype(np.int64)

    def shard_uses(self, start: int, stop: int, rank: int = 0,
                   world_size: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every use of a shard by this rank in ``[start, stop)``: ``(shards, first, last)``.

        A *use* is one piece of a shard (a shard is split into pieces where it straddles
        partitions, read at different times of the epoch: a shard recurs). ``first`` is the
        first order position that reads the piece, ``last`` an upper bound of its last (the
        end of the last shuffle block that holds it), both inside the window; uses are sorted
        by ``first``. This is the whole future a cache needs to evict the shard whose next use
        is furthest away (Belady) and to prefetch ahead. Costs O(blocks + pieces).
        """
        start, stop = self._check_window(start, stop)
        rank, world_size = self._check_rank(rank, world_size)
        if not self.options.shuffle:
            return self._natural_shard_uses(start, stop, rank, world_size)
        P, K = self.options.partitions, self.options.block_size
        parts = np.arange(rank, P, world_size, dtype=np.int64)
        # Elements j of partition p with start <= j*P + p < stop.
        jlos = np.maximum(0, -((parts - start) // P))
        jhis = np.maximum(0, -((parts - stop) // P))
        kmin = np.full(len(self._piece_pos), np.iinfo(np.int64).max, dtype=np.int64)
        _k.first_needs(parts, jlos, jhis, np.int64(P), np.int64(K), np.int64(self._q),
                       np.int64(self._rem), self._pkeys, self._piece_pos, kmin)
        hit = np.flatnonzero(kmin != np.iinfo(np.int64).max)
        by_time = hit[np.argsort(kmin[hit], kind="stable")]
        # last: the last element of the last block holding the piece (an upper bound)
        p = self._piece_part[by_time]
        pstart = p * self._q + np.minimum(p, self._rem)
        plen = self._q + (p < self._rem)
        ends = np.append(self._piece_pos[1:], self.num_samples)[by_time]
        jlast = np.minimum(((ends - 1 - pstart) // K + 1) * K, plen) - 1
        last = np.minimum(jlast * P + p, stop - 1)
        return (self._piece_shard[by_time].astype(np.int64), kmin[by_time].astype(np.int64),
                last.astype(np.int64))

    # -- blocks: what a rank stages at once (stoker.loader.read.staging) -----------------------------
    def blocks_per_partition(self) -> int:
        """Blocks in the longest partition: the rounds of one epoch (round ``b`` is block ``b``
        of every partition; all partitions enter block ``b`` at the same global position)."""
        longest = self._q + (self._rem > 0)
        return -(-longest // self.options.block_size) if longest else 0

    def _partition_of(self, pos: np.ndarray) -> np.ndarray:
        q, rem = self._q, self._rem
        big = pos < (q + 1) * rem
        return np.where(big, pos // (q + 1), rem + (pos - (q + 1) * rem) // max(q, 1))

    def block_of(self, ids: np.ndarray) -> np.ndarray:
        """Block index (element ``j // K`` inside its partition) of each global sample id:
        the staging round that holds it. Shuffled orders only."""
        ids = np.asarray(ids, dtype=np.int64)
        by_gid = self._by_gid()
        i = np.searchsorted(self._piece_gid[by_gid], ids, side="right") - 1
        piece = by_gid[np.maximum(i, 0)]
        pos = self._piece_pos[piece] + ids - self._piece_gid[piece]
        p = self._partition_of(pos)
        start = p * self._q + np.minimum(p, self._rem)
        return (pos - start) // self.options.block_size

    def _by_gid(self) -> np.ndarray:
        cached = getattr(self, "_gid_order", None)
        if cached is None:
            cached = self._gid_order = np.argsort(self._piece_gid, kind="stable")
        return cached

    def block_ranges(self, block: int, rank: int = 0,
                     world_size: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """``(gid_start, length)`` of the contiguous id ranges that block ``block`` of the
        partitions ``rank`` owns covers, sorted by id: the rows one staging round copies.

        A block is ``K`` consecutive elements of the shard-permuted stream, so it is one run
        of rows per shard it crosses (at most ``ceil(K / smallest shard) + 1`` runs).
        """
        rank, world_size = self._check_rank(rank, world_size)
        K, P, q, rem = self.options.block_size, self.options.partitions, self._q, self._rem
        parts = np.arange(rank, P, world_size, dtype=np.int64)
        start = parts * q + np.minimum(parts, rem)
        length = q + (parts < rem)
        lo = start + np.minimum(block * K, length)
        hi = start + np.minimum((block + 1) * K, length)
        keep = hi > lo
        lo, hi = lo[keep], hi[keep]
        first = np.searchsorted(self._piece_pos, lo, side="right") - 1
        last = np.searchsorted(self._piece_pos, hi, side="left")  # pieces starting before hi
        count = last - first
        piece = np.repeat(first, count) + (np.arange(count.sum()) - np.repeat(np.cumsum(count)
                                                                              - count, count))
        seg_lo = np.maximum(np.repeat(lo, count), self._piece_pos[piece])
        nxt = np.append(self._piece_pos[1:], self.num_samples)[piece]
        seg_hi = np.minimum(np.repeat(hi, count), nxt)
        gid = self._piece_gid[piece] + seg_lo - self._piece_pos[piece]
        o = np.argsort(gid, kind="stable")
        return gid[o].astype(np.int64), (seg_hi - seg_lo)[o].astype(np.int64)

    def _natural_shard_uses(self, start: int, stop: int, rank: int,
                            world: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if stop <= start:
            empty = np.empty(0, dtype=np.int64)
            return empty, empty, empty
        lo = np.searchsorted(self._cumsum, start, side="right")
        hi = np.searchsorted(self._cumsum, stop - 1, side="right")
        shards = np.arange(lo, hi + 1, dtype=np.int64)
        s0 = np.maximum(self._cumsum[shards] - self._rows[shards], start)
        s1 = np.minimum(self._cumsum[shards], stop)
        first = s0 + (rank - s0) % world  # first position owned by the rank in the shard
        last = s1 - 1 - (s1 - 1 - rank) % world
        keep = (self._rows[shards] > 0) & (first < s1)
        return shards[keep], first[keep], last[keep]

