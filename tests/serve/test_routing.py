"""Rendezvous routing of batch keys to servers: pure, balanced, and minimal on change."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.loader.service.client import rendezvous

_URLS = st.lists(st.integers(1024, 65535).map(lambda p: f"grpc://127.0.0.1:{p}"),
                 min_size=2, max_size=6, unique=True)


@settings(max_examples=50, deadline=None)
@given(urls=_URLS, affinity=st.integers(-1, 10**6), dataset=st.text(min_size=1, max_size=8))
def test_every_client_ranks_alike_whatever_the_listing_order(urls: list[str], affinity: int,
                                                            dataset: str) -> None:
    ranked = rendezvous(urls, dataset, affinity)
    assert sorted(ranked) == sorted(urls)
    assert rendezvous(list(reversed(urls)), dataset, affinity) == ranked


@settings(max_examples=50, deadline=None)
@given(urls=_URLS, gone=st.integers(0, 5))
def test_removing_a_server_moves_only_its_keys(urls: list[str], gone: int) -> None:
    lost = urls[gone % len(urls)]
    rest = [u for u in urls if u != lost]
    for affinity in range(200):
        before = rendezvous(urls, "fp", affinity)
        after = rendezvous(rest, "fp", affinity)
        assert after == [u for u in before if u != lost]  # the order of the others is kept


def test_keys_spread_over_the_servers() -> None:
    urls = [f"grpc://10.0.0.{i}:7000" for i in range(4)]
    first = Counter(rendezvous(urls, "fp", a)[0] for a in range(4000))
    assert sorted(first) == sorted(urls)
    assert all(800 <= n <= 1200 for n in first.values()), first  # 1000 each, +-20 %
