"""Seed-keyed bijections and the order kernels, in Numba, with pure-Python references.

Everything random in the sample order comes from :func:`mix64` (the SplitMix64 finaliser, a
bijection of 64-bit integers with full avalanche): a stream of keys is ``mix64(key + i * G)``
(SplitMix64 proper) and a block permutation is an unbalanced Feistel network over the smallest
power-of-two domain holding the block, whose rounds are ``mix64(right ^ round_key)``, with
*cycle walking* (re-encrypt until the value falls inside ``[0, n)``), which turns a permutation
of ``[0, 2**bits)`` into one of ``[0, n)``. Because ``2**bits < 2 * n`` a walk takes under two
steps on average.

All arithmetic is unsigned 64-bit and wraps; the ``*_py`` functions compute the same values with
Python integers masked to 64 bits, and the tests check they agree bit for bit, so an audit can
replay an order without Numba. :func:`order_at_np` is the vectorised NumPy twin the loader uses
for its first batches while a fresh process is still loading the kernels (Numba's one-time
start-up is ~0.2 s; NumPy needs ~1 ms for a batch's ids).

Layout shared by the kernels (built by :class:`stoker.loader.order.epoch.EpochOrder`): the epoch's
sample stream is a list of *pieces* (runs of consecutive global ids) with stream start
``piece_pos`` (sorted, first is 0) and first global id ``piece_gid``; partition ``p`` covers
stream positions ``[b_p, b_p + L_p)`` with ``L_p = q + (p < rem)``, ``b_p = p*q + min(p, rem)``.
"""

from __future__ import annotations

import numpy as np

from stoker.loader.jit.kernel import kernel
from stoker.loader.jit.search import last_at_or_below

__all__ = [
    "ROUNDS",
    "domain_bits",
    "feistel",
    "feistel_py",
    "first_needs",
    "hash_keys",
    "hash_keys_py",
    "mix64",
    "mix64_py",
    "order_at",
    "order_at_np",
    "order_at_py",
    "order_range",
]

ROUNDS = 6
"""Feistel rounds; even, so the unbalanced halves end where they started (``_encrypt_lanes``
writes the six out)."""

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
# NumPy scalars, so that Numba types every operation as uint64 (mixing a Python int into
# uint64 arithmetic would promote to float64).
_U_GOLDEN = np.uint64(_GOLDEN)
_U_M1 = np.uint64(_M1)
_U_M2 = np.uint64(_M2)
_U0 = np.uint64(0)
_U1 = np.uint64(1)
_U27 = np.uint64(27)
_U30 = np.uint64(30)
_U31 = np.uint64(31)
_NONE = np.iinfo(np.int64).max


# --- pure-Python references -----------------------------------------------------------------
def mix64_py(z: int) -> int:
    """SplitMix64 finaliser of ``z`` (mod 2**64)."""
    z &= _MASK64
    z = ((z ^ (z >> 30)) * _M1) & _MASK64
    z = ((z ^ (z >> 27)) * _M2) & _MASK64
    return z ^ (z >> 31)


def hash_keys_py(key: int, n: int) -> list[int]:
    """The SplitMix64 stream of ``key``: ``[mix64(key + (i + 1) * G) for i in range(n)]``."""
    return [mix64_py(key + (i + 1) * _GOLDEN) for i in range(n)]


def domain_bits(n: int) -> int:
    """Bits of the Feistel domain for a block of ``n`` (>= 2): smallest 2**bits >= n, bits >= 2."""
    return max(2, (int(n) - 1).bit_length())


def _encrypt_py(x: int, bits: int, key: int) -> int:
    a = bits - bits // 2
    b = bits // 2
    for r in range(ROUNDS):
        left, right = x >> b, x & ((1 << b) - 1)
        f = mix64_py(right ^ ((key + (r + 1) * _GOLDEN) & _MASK64)) & ((1 << a) - 1)
        x = (right << a) | (left ^ f)
        a, b = b, a
    return x


def feistel_py(x: int, n: int, key: int) -> int:
    """Image of ``x`` under the ``key``-ed bijection of ``[0, n)`` (reference of ``feistel``)."""
    if n <= 1:
        return x
    bits = domain_bits(n)
    y = _encrypt_py(x, bits, key & _MASK64)
    while y >= n:
        y = _encrypt_py(y, bits, key & _MASK64)
    return y


def _partition_bounds_py(p: int, q: int, rem: int) -> tuple[int, int]:
    return p * q + min(p, rem), q + (1 if p < rem else 0)


def order_at_py(k: int, P: int, K: int, q: int, rem: int, pkeys: list[int],
                piece_pos: list[int], piece_gid: list[int]) -> int:
    """Reference of :func:`order_at` for one position ``k``: plain loops, no NumPy."""
    p, j = k % P, k // P
    b, o = j // K, j % K
    start, length = _partition_bounds_py(p, q, rem)
    blen = min(K, length - b * K)
    bkey = mix64_py(pkeys[p] + (b + 1) * _GOLDEN)
    t = start + b * K + feistel_py(o, blen, bkey)
    i = max(i for i, pos in enumerate(piece_pos) if pos <= t)
    return piece_gid[i] + (t - piece_pos[i])


# --- NumPy twin -------------------------------------------------------------------------------
def _mix64_np(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> _U30)) * _U_M1
    z = (z ^ (z >> _U27)) * _U_M2
    return z ^ (z >> _U31)


def _encrypt_np(x: np.ndarray, bits: np.ndarray, key: np.ndarray) -> np.ndarray:
    a = (bits - bits // 2).astype(np.uint64)
    b = (bits // 2).astype(np.uint64)
    rkey = key
    for _ in range(ROUNDS):
        rkey = rkey + _U_GOLDEN
        right = x & ((_U1 << b) - _U1)
        f = _mix64_np(right ^ rkey) & ((_U1 << a) - _U1)
        x = (right << a) | ((x >> b) ^ f)
        a, b = b, a
    return x


def _feistel_np(x: np.ndarray, n: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Elementwise :func:`feistel` (blocks of 0 or 1 elements map to themselves)."""
    out = x.copy()
    m = n > 1
    if not m.any():
        return out
    nn = n[m]
    bits = np.full(len(nn), 2, dtype=np.int64)  # as _bits: smallest >= 2 with 2**bits >= n
    short = np.flatnonzero((np.int64(1) << bits) < nn)
    while len(short):
        bits[short] += 1
        short = short[(np.int64(1) << bits[short]) < nn[short]]
    k = key[m]
    y = _encrypt_np(out[m].astype(np.uint64), bits, k)
    walk = np.flatnonzero(y >= nn.astype(np.uint64))
    while len(walk):  # cycle walking: under two steps on average
        y[walk] = _encrypt_np(y[walk], bits[walk], k[walk])
        walk = walk[y[walk] >= nn[walk].astype(np.uint64)]
    out[m] = y.astype(np.int64)
    return out


def order_at_np(ks: np.ndarray, P: int, K: int, q: int, rem: int, pkeys: np.ndarray,
                piece_pos: np.ndarray, piece_gid: np.ndarray) -> np.ndarray:
    """int64 ``[O[k] for k in ks]``, vectorised NumPy, equal to :func:`order_at`."""
    k = np.asarray(ks, dtype=np.int64)
    p = k % P
    j = k // P
    b = j // K
    length = q + (p < rem)
    blen = np.minimum(K, length - b * K)
    bkey = _mix64_np(pkeys[p] + (b + 1).astype(np.uint64) * _U_GOLDEN)
    t = p * q + np.minimum(p, rem) + b * K + _feistel_np(j - b * K, blen, bkey)
    c = np.searchsorted(piece_pos, t, side="right") - 1
    return piece_gid[c] + (t - piece_pos[c])


# --- Numba kernels ----------------------------------------------------------------------------
@kernel
def mix64(z):  # type: ignore[no-untyped-def]
    """SplitMix64 finaliser of a uint64 (wrapping)."""
    z = (z ^ (z >> _U30)) * _U_M1
    z = (z ^ (z >> _U27)) * _U_M2
    return z ^ (z >> _U31)


def hash_keys(key: np.uint64 | int, n: int) -> np.ndarray:
    """uint64[n]: the SplitMix64 stream of ``key`` (see :func:`hash_keys_py`).

    Plain NumPy (uint64 array arithmetic wraps silently), so building an order needs no
    compiled kernel before its first ``ids`` call.
    """
    z = np.uint64(int(key) & _MASK64) + np.arange(1, n + 1, dtype=np.uint64) * _U_GOLDEN
    z = (z ^ (z >> _U30)) * _U_M1
    z = (z ^ (z >> _U27)) * _U_M2
    return z ^ (z >> _U31)


@kernel
def _bits(n):  # type: ignore[no-untyped-def]
    bits = 2
    while (np.int64(1) << bits) < n:
        bits += 1
    return bits


@kernel
def _encrypt(x, bits, key):  # type: ignore[no-untyped-def]
    a = np.uint64(bits - bits // 2)
    b = np.uint64(bits // 2)
    rkey = key
    for _ in range(ROUNDS):
        rkey = rkey + _U_GOLDEN
        left = x >> b
        right = x & ((_U1 << b) - _U1)
        f = mix64(right ^ rkey) & ((_U1 << a) - _U1)
        x = (right << a) | (left ^ f)
        a, b = b, a
    return x


@kernel
def feistel(x, n, bits, key):  # type: ignore[no-untyped-def]
    """Image of ``x`` in ``[0, n)`` under the bijection keyed by uint64 ``key``.

    ``bits`` must be ``domain_bits(n)``; callers hoist it out of their loops.
    """
    if n <= 1:
        return x
    nn = np.uint64(n)
    y = _encrypt(np.uint64(x), bits, key)
    while y >= nn:
        y = _encrypt(y, bits, key)
    return np.int64(y)


@kernel
def _find_piece(piece_pos, t):  # type: ignore[no-untyped-def]
    """Index of the last piece starting at or before stream position ``t``."""
    return last_at_or_below(piece_pos, t, 0, piece_pos.shape[0])


@kernel
def _stream_pos(k, P, K, bits_k, q, rem, pkeys):  # type: ignore[no-untyped-def]
    """Stream position of global order position ``k`` (partition, block, Feistel)."""
    p = k % P
    j = k // P
    b = j // K
    o = j - b * K
    length = q + (1 if p < rem else 0)
    start = p * q + min(p, rem)
    blen = min(K, length - b * K)
    bkey = mix64(pkeys[p] + np.uint64(b + 1) * _U_GOLDEN)
    bits = bits_k if blen == K else _bits(blen)
    return start + b * K + feistel(o, blen, bits, bkey)


@kernel
def _encrypt_lanes(x, bits, keys, out, m):  # type: ignore[no-untyped-def]
    """``out[i] = _encrypt(x[i], bits[i], keys[i])`` for ``i < m``: one branch-free loop with
    the rounds written out, which LLVM vectorises (the lanes' shifts differ; ~1.8x faster
    per encryption than :func:`_encrypt` one position at a time)."""
    for i in range(m):
        bt = np.uint64(bits[i])
        b = bt >> _U1
        a = bt - b
        ma = (_U1 << a) - _U1
        mb = (_U1 << b) - _U1
        k = keys[i]
        v = x[i]
        k = k + _U_GOLDEN  # rounds 1-6 (ROUNDS), halves (a, b) then (b, a), as _encrypt
        v = ((v & mb) << a) | ((v >> b) ^ (mix64((v & mb) ^ k) & ma))
        k = k + _U_GOLDEN
        v = ((v & ma) << b) | ((v >> a) ^ (mix64((v & ma) ^ k) & mb))
        k = k + _U_GOLDEN
        v = ((v & mb) << a) | ((v >> b) ^ (mix64((v & mb) ^ k) & ma))
        k = k + _U_GOLDEN
        v = ((v & ma) << b) | ((v >> a) ^ (mix64((v & ma) ^ k) & mb))
        k = k + _U_GOLDEN
        v = ((v & mb) << a) | ((v >> b) ^ (mix64((v & mb) ^ k) & ma))
        k = k + _U_GOLDEN
        v = ((v & ma) << b) | ((v >> a) ^ (mix64((v & ma) ^ k) & mb))
        out[i] = v


_LANES = 128  # positions order_range takes through each step at a time


@kernel
def order_range(start, stop, step, P, K, q, rem, pkeys,  # type: ignore[no-untyped-def]
                piece_pos, piece_gid):
    """int64 ``[O[k] for k in range(start, stop, step)]``.

    Consecutive positions revisit the same block of each partition, so what depends on the
    block alone (its stream start, length, Feistel bits and key, and the pieces it spans) is
    computed when a partition enters a block and kept per partition. Positions go
    ``_LANES`` at a time: their block offsets are gathered, encrypted once in one vectorised
    loop (:func:`_encrypt_lanes`), then walked (the rare re-encryptions) and searched in the
    pieces of their block. Same values as :func:`order_at`.
    """
    n = max(0, (stop - start + step - 1) // step)
    out = np.empty(n, dtype=np.int64)
    cur = np.full(P, -1, dtype=np.int64)
    lo = np.zeros(P, dtype=np.int64)
    hi = np.zeros(P, dtype=np.int64)
    base = np.zeros(P, dtype=np.int64)
    blens = np.zeros(P, dtype=np.int64)
    bits = np.zeros(P, dtype=np.int64)
    bkeys = np.zeros(P, dtype=np.uint64)
    # a lane keeps its block's values: a partition may enter its next block within the same
    # _LANES positions (P < _LANES)
    lane_base = np.empty(_LANES, dtype=np.int64)
    lane_len = np.empty(_LANES, dtype=np.int64)
    lane_lo = np.empty(_LANES, dtype=np.int64)
    lane_hi = np.empty(_LANES, dtype=np.int64)
    lane_x = np.empty(_LANES, dtype=np.uint64)
    lane_bits = np.empty(_LANES, dtype=np.int64)
    lane_key = np.empty(_LANES, dtype=np.uint64)
    lane_y = np.empty(_LANES, dtype=np.uint64)
    walk = np.empty(_LANES, dtype=np.int64)
    walk_x = np.empty(_LANES, dtype=np.uint64)
    walk_bits = np.empty(_LANES, dtype=np.int64)
    walk_key = np.empty(_LANES, dtype=np.uint64)
    walk_y = np.empty(_LANES, dtype=np.uint64)
    p = start % P  # (p, j) = divmod(k, P), stepped without a division per position
    j = start // P
    for i0 in range(0, n, _LANES):
        m = min(_LANES, n - i0)
        for t in range(m):
            if i0 + t:
                p += step
                while p >= P:
                    p -= P
                    j += 1
            b = j // K
            if cur[p] != b:
                s0 = p * q + min(p, rem) + b * K
                blen = min(K, q + (1 if p < rem else 0) - b * K)
                cur[p] = b
                base[p] = s0
                blens[p] = blen
                bits[p] = _bits(blen)
                bkeys[p] = mix64(pkeys[p] + np.uint64(b + 1) * _U_GOLDEN)
                lo[p] = _find_piece(piece_pos, s0)
                hi[p] = _find_piece(piece_pos, s0 + blen - 1) + 1
            lane_base[t] = base[p]
            lane_len[t] = blens[p]
            lane_lo[t] = lo[p]
            lane_hi[t] = hi[p]
            lane_x[t] = np.uint64(j - b * K)
            lane_bits[t] = bits[p]
            lane_key[t] = bkeys[p]
        _encrypt_lanes(lane_x, lane_bits, lane_key, lane_y, m)
        w = 0  # cycle walking: lanes outside their block encrypt again, together
        for t in range(m):
            if lane_len[t] <= 1:  # as feistel: a block of one is the identity
                lane_y[t] = lane_x[t]
            elif lane_y[t] >= np.uint64(lane_len[t]):
                walk[w] = t
                w += 1
        while w:
            for u in range(w):
                t = walk[u]
                walk_x[u] = lane_y[t]
                walk_bits[u] = lane_bits[t]
                walk_key[u] = lane_key[t]
            _encrypt_lanes(walk_x, walk_bits, walk_key, walk_y, w)
            left = 0
            for u in range(w):
                t = walk[u]
                lane_y[t] = walk_y[u]
                if walk_y[u] >= np.uint64(lane_len[t]):
                    walk[left] = t
                    left += 1
            w = left
        for t in range(m):
            pos = lane_base[t] + np.int64(lane_y[t])
            c = last_at_or_below(piece_pos, pos, lane_lo[t], lane_hi[t])
            out[i0 + t] = piece_gid[c] + (pos - piece_pos[c])
    return out


@kernel
def order_at(ks, P, K, q, rem, pkeys, piece_pos, piece_gid):  # type: ignore[no-untyped-def]
    """int64 ``[O[k] for k in ks]`` for arbitrary positions."""
    out = np.empty(ks.shape[0], dtype=np.int64)
    bits_k = _bits(K)
    for i in range(ks.shape[0]):
        t = _stream_pos(ks[i], P, K, bits_k, q, rem, pkeys)
        c = _find_piece(piece_pos, t)
        out[i] = piece_gid[c] + (t - piece_pos[c])
    return out


@kernel
def first_needs(parts, jlos, jhis, P, K, q, rem,  # type: ignore[no-untyped-def]
                pkeys, piece_pos, kmin):
    """Fill ``kmin[piece]`` with the first order position that reads each piece.

    For each partition ``parts[i]`` and its element range ``[jlos[i], jhis[i])``, walk its
    blocks in order; a block's stream range is a known run of pieces, so the scan of a fully
    covered block stops as soon as every piece not seen before has been hit, and a block whose
    pieces were all seen is skipped. Cost: O(blocks + pieces) plus the scans, not O(samples).
    ``kmin`` must come in filled with int64 max ("never").
    """
    bits_k = _bits(K)
    for i in range(parts.shape[0]):
        p = parts[i]
        jlo = jlos[i]
        jhi = jhis[i]
        if jhi <= jlo:
            continue
        length = q + (1 if p < rem else 0)
        pstart = p * q + min(p, rem)
        for b in range(jlo // K, (jhi - 1) // K + 1):
            blen = min(K, length - b * K)
            s0 = pstart + b * K
            first = _find_piece(piece_pos, s0)
            last = _find_piece(piece_pos, s0 + blen - 1)
            needed = 0
            for c in range(first, last + 1):
                if kmin[c] == _NONE:
                    needed += 1
            if needed == 0:
                continue
            bkey = mix64(pkeys[p] + np.uint64(b + 1) * _U_GOLDEN)
            bits = bits_k if blen == K else _bits(blen)
            for j in range(max(jlo, b * K), min(jhi, b * K + blen)):
                c = _find_piece(piece_pos, s0 + feistel(j - b * K, blen, bits, bkey))
                if kmin[c] == _NONE:
                    kmin[c] = j * P + p
                    needed -= 1
                    if needed == 0:
                        break
