"""The Numba kernels agree bit for bit with the pure-Python references, and are bijections."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.loader.order import feistel as k

U64 = st.integers(0, 2**64 - 1)


def test_mix64_matches_reference_and_known_values() -> None:
    zs = [0, 1, 2, 2**63, 2**64 - 1, 0x9E3779B97F4A7C15, 123456789]
    got = [int(k.mix64(np.uint64(z))) for z in zs]
    assert got == [k.mix64_py(z) for z in zs]
    # SplitMix64 seeded with 0 starts 0xE220A8397B1DCDAF (Vigna's reference implementation).
    assert k.hash_keys_py(0, 1) == [0xE220A8397B1DCDAF]


@settings(max_examples=50, deadline=None)
@given(key=U64, n=st.integers(0, 40))
def test_hash_keys_matches_reference(key: int, n: int) -> None:
    assert k.hash_keys(np.uint64(key), n).tolist() == k.hash_keys_py(key, n)


@settings(max_examples=60, deadline=None)
@given(key=U64, n=st.integers(1, 300))
def test_feistel_is_a_bijection_matching_reference(key: int, n: int) -> None:
    bits = k.domain_bits(n)
    got = [int(k.feistel(np.int64(x), np.int64(n), bits, np.uint64(key))) for x in range(n)]
    assert sorted(got) == list(range(n))
    assert got == [k.feistel_py(x, n, key) for x in range(n)]


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9, 1000, 1024, 1025])
def test_feistel_key_changes_the_permutation(n: int) -> None:
    bits = k.domain_bits(n)
    perms = {tuple(int(k.feistel(np.int64(x), np.int64(n), bits, np.uint64(key)))
                   for x in range(n)) for key in range(20)}
    assert len(perms) > (1 if n == 2 else 5)


def test_order_kernels_match_reference() -> None:
    P, K, q, rem = 3, 5, 7, 2                     # N = 23, partitions of 8, 8, 7
    pkeys = k.hash_keys(np.uint64(99), P)
    pos = np.array([0, 4, 9, 16, 20], dtype=np.int64)
    gid = np.array([100, 0, 50, 30, 9], dtype=np.int64)
    ks = np.arange(23, dtype=np.int64)
    ref = [k.order_at_py(int(x), P, K, q, rem, [int(v) for v in pkeys], pos.tolist(), gid.tolist())
           for x in ks]
    args = (np.int64(P), np.int64(K), np.int64(q), np.int64(rem), pkeys, pos, gid)
    assert k.order_at(ks, *args).tolist() == ref
    assert k.order_range(np.int64(0), np.int64(23), np.int64(1), *args).tolist() == ref
    assert k.order_range(np.int64(2), np.int64(23), np.int64(3), *args).tolist() == ref[2::3]


@settings(max_examples=60, deadline=None)
@given(P=st.integers(1, 9), K=st.integers(1, 70), n=st.integers(1, 400),
       pieces=st.integers(1, 6), key=st.integers(0, 2**64 - 1), data=st.data())
def test_numpy_twin_matches_the_kernel(P: int, K: int, n: int, pieces: int, key: int,
                                       data: st.DataObject) -> None:
    """order_at_np (first batches of a fresh process) == order_at, bit for bit."""
    q, rem = n // P, n % P
    pkeys = k.hash_keys(np.uint64(key), P)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(n - 1, 1)), max_size=pieces - 1))))
    pos = np.array([0] + [c for c in cuts if c < n], dtype=np.int64)
    gid = np.array(data.draw(st.permutations(range(len(pos))))) * 1000
    ks = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=64)),
                  dtype=np.int64)
    args = (np.int64(P), np.int64(K), np.int64(q), np.int64(rem), pkeys, pos, gid)
    assert k.order_at_np(ks, *args).tolist() == k.order_at(ks, *args).tolist()


@settings(max_examples=80, deadline=None)
@given(P=st.integers(1, 300), K=st.integers(1, 70), n=st.integers(1, 3000),
       pieces=st.integers(1, 6), key=st.integers(0, 2**64 - 1), step=st.integers(1, 7),
       data=st.data())
def test_order_range_equals_random_access_across_lane_groups(
        P: int, K: int, n: int, pieces: int, key: int, step: int, data: st.DataObject) -> None:
    """order_range (positions 128 at a time, one vectorised encryption per group) == order_at
    (one position at a time), for windows that cross groups, blocks and, with P < 128, a
    partition's next block inside one group."""
    q, rem = n // P, n % P
    pkeys = k.hash_keys(np.uint64(key), P)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(n - 1, 1)), max_size=pieces - 1))))
    pos = np.array([0] + [c for c in cuts if c < n], dtype=np.int64)
    gid = np.array(data.draw(st.permutations(range(len(pos))))) * 10_000
    start = data.draw(st.integers(0, n))
    stop = data.draw(st.integers(start, n))
    args = (np.int64(P), np.int64(K), np.int64(q), np.int64(rem), pkeys, pos, gid)
    want = k.order_at(np.arange(start, stop, step, dtype=np.int64), *args)
    got = k.order_range(np.int64(start), np.int64(stop), np.int64(step), *args)
    assert got.tolist() == want.tolist()
    if len(want):
        want[len(want) // 2] += 1
        assert got.tolist() != want.tolist()  # the comparison can fail
