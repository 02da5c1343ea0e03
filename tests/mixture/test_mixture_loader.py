"""DataLoader over a Mixture: the written rule, every worker mode, rank and resume."""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from mixture_helpers import expected, make_source, pairs, pairs_until
from stoker.loader import DataLoader, ShuffleOptions, WorkerOptions
from stoker.loader.errors import StateError
from stoker.loader.order.mixture import Mixture

WEIGHTS = {"web": math.sqrt(2), "code": math.sqrt(3), "books": math.sqrt(5)}


def _mixture(sources: dict[str, Path], **kw) -> Mixture:
    return Mixture({n: str(p) for n, p in sources.items()}, kw.pop("weights", WEIGHTS), **kw)


def _epochs(dl: DataLoader, epochs: int) -> list[dict]:
    out = []
    for e in range(epochs):
        dl.set_epoch(e)
        out += list(dl)
    return out


def test_batches_follow_the_blend_and_each_sources_own_order(sources) -> None:
    mix = _mixture(sources)
    dl = DataLoader(mix, batch_size=16, shuffle=True, seed=11)
    got = pairs(_epochs(dl, 3))
    L = mix.num_samples
    assert got == expected(mix, 11, 0, 3 * L, dl.order_options)
    assert got != expected(mix, 12, 0, 3 * L, dl.order_options)  # the comparison can fail
    dl.close()


def test_every_pass_is_a_permutation_and_the_next_pass_a_fresh_order(sources) -> None:
    mix = _mixture(sources)
    dl = DataLoader(mix, batch_size=32, seed=5, shuffle=ShuffleOptions(partitions=4))
    got = pairs(_epochs(dl, 8))
    for i, size in enumerate(mix.sizes):
        ids = [sid for s, sid in got if s == i]
        passes = [ids[p * size:(p + 1) * size] for p in range(len(ids) // size)]
        assert len(passes) >= 3, "the run must cover three full passes of every source"
        for p in passes:
            assert sorted(p) == list(range(size))
        # a fresh order per pass (13 samples in 2 shards have few orders: some may repeat)
        assert len({tuple(p) for p in passes}) == len(passes) if size > 20 else \
            len({tuple(p) for p in passes}) > 1
    dl.close()


def test_batch_source_column_and_realised_proportions(sources) -> None:
    mix = _mixture(sources)
    dl = DataLoader(mix, batch_size=50, shuffle=True, seed=1)
    batches = _epochs(dl, 2)
    src = torch.cat([b["source"] for b in batches])
    assert src.dtype == torch.int64
    names = [mix.names[i] for i in src.tolist()]
    assert [b["name"][0].startswith(f"s{mix.names.index(n)}-") for b, n in
            zip(batches, (names[k * 50] for k in range(len(batches))))] == [True] * len(batches)
    counts = np.bincount(src.numpy(), minlength=3)
    target = [float(w) * len(src) for w in mix.weights.values()]
    assert all(abs(c - t) < 1 for c, t in zip(counts, target))
    dl.close()


@pytest.mark.parametrize("kw", [dict(num_workers=2), dict(num_workers=4),
                                dict(num_workers=2, workers=WorkerOptions(mode="process"))],
                         ids=["threads2", "threads4", "processes2"])
def test_stream_is_identical_for_every_worker_count_and_mode(sources, kw) -> None:
    mix = _mixture(sources)
    base = DataLoader(mix, batch_size=16, shuffle=True, seed=3)
    ref = _epochs(base, 2)
    base.close()
    dl = DataLoader(mix, batch_size=16, shuffle=True, seed=3, **kw)
    got = _epochs(dl, 2)
    dl.close()
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(a[key], torch.Tensor):
                assert torch.equal(a[key], b[key]), key
            else:
                assert a[key] == b[key], key


@pytest.mark.parametrize("world", [2, 4])
def test_union_of_ranks_is_the_global_batch(sources, world: int) -> None:
    mix = _mixture(sources)
    g = 16
    one = DataLoader(mix, batch_size=g, shuffle=True, seed=8)
    ref = [pairs([b]) for b in _epochs(one, 2)]
    one.close()
    ranks = [DataLoader(mix, batch_size=g // world, shuffle=True, seed=8, rank=r,
                        world_size=world) for r in range(world)]
    per_rank = [[pairs([b]) for b in _epochs(dl, 2)] for dl in ranks]
    for dl in ranks:
        dl.close()
    for step, whole in enumerate(ref):
        merged = [per_rank[k % world][step][k // world] for k in range(len(whole))]
        assert merged == whole


@pytest.mark.parametrize("trial", range(4))
def test_resume_with_other_workers_continues_exactly(sources, trial: int) -> None:
    mix = _mixture(sources, schedule=[(150, {"web": 1, "code": 1, "books": 5})])
    kw = dict(batch_size=12, shuffle=True, seed=21)
    ref = pairs(_epochs(DataLoader(mix, **kw), 3))
    steps = len(DataLoader(mix, **kw))
    stop = random.Random(trial).randrange(1, 3 * steps - 1)
    got, state = pairs_until(DataLoader(mix, num_workers=[0, 2, 4, 3][trial], **kw), stop)
    resumed = DataLoader(mix, num_workers=[4, 0, 2, 1][trial],
                         workers=WorkerOptions(mode="process" if trial == 3 else "thread"),
                         **kw)
    resumed.load_state_dict(state)
    while resumed.epoch < 3:
        got += pairs(resumed)
    resumed.close()
    assert got == ref


def test_a_state_saved_under_the_earlier_order_rule_is_refused(sources) -> None:
    """Before stoker.mixture-order/2 every source used all the partitions: the same options
    gave another stream, so such a state is refused by its fingerprint, naming the rule."""
    from stoker.loader.order.blend import BLEND_ALGORITHM
    from stoker.manifest import canonical_json, hash_bytes

    mix = _mixture(sources)
    dl = DataLoader(mix, batch_size=12, shuffle=True, seed=21)
    _, state = pairs_until(dl, 3)
    old = {"algorithm": BLEND_ALGORITHM,
           "sources": [[n, m.fingerprint] for n, m in zip(mix.names, mix.manifests)],
           "segments": mix.blend.to_dict()["segments"]}
    state["fingerprint"] = hash_bytes(canonical_json(old))
    with pytest.raises(StateError, match="'stoker.mixture-order/2'.*share of the partitions"):
        DataLoader(mix, batch_size=12, shuffle=True, seed=21).load_state_dict(state)


@pytest.mark.parametrize("workers", [0, 2])
def test_sources_read_one_by_one_follow_the_same_rule(sources, tmp_path: Path,
                                                      workers: int) -> None:
    """A source whose schema differs (x not nullable) cannot share the others' reader: each
    source is read on its own and the batch merged back in stream order."""
    make_source(tmp_path / "strict", [9, 14], salt=3, nullable=False)
    mix = Mixture({"web": str(sources["web"]), "strict": str(tmp_path / "strict"),
                   "books": str(sources["books"])}, {"web": 1, "strict": 2, "books": 1})
    dl = DataLoader(mix, batch_size=16, shuffle=True, seed=6, num_workers=workers)
    assert not dl._source.union
    batches = _epochs(dl, 3)
    assert pairs(batches) == expected(mix, 6, 0, 3 * mix.num_samples, dl.order_options)
    salts = (0, 3, 2)
    for b in batches:  # every column's values belong to the (source, id) of their row
        for s, i, x, name, seq, n in zip(b["source"].tolist(), b["id"].tolist(),
                                         b["x"].tolist(), b["name"], b["seq"].tolist(),
                                         b["seq_lengths"].tolist()):
            assert x == i * 0.5 + salts[s] and name == f"s{salts[s]}-{i}"
            assert n == i % 3 and seq[:n] == [float(i)] * n and not any(seq[n:])
    dl.close()
    assert DataLoader(_mixture(sources), batch_size=4)._source.union


def test_one_source_mixture_is_that_sources_own_order(sources) -> None:
    kw = dict(batch_size=10, shuffle=True, seed=77)
    plain = DataLoader(str(sources["web"]), **kw)
    mixed = DataLoader(Mixture({"web": str(sources["web"])}), **kw)
    a, b = _epochs(plain, 3), _epochs(mixed, 3)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert y.pop("source").tolist() == [0] * len(y["id"])
        assert x.keys() == y.keys()
        assert all(torch.equal(x[k], y[k]) if isinstance(x[k], torch.Tensor) else x[k] == y[k]
                   for k in x)


def test_natural_order_blends_each_source_in_order(sources) -> None:
    mix = _mixture(sources)
    dl = DataLoader(mix, batch_size=20, shuffle=False)
    got = pairs(_epochs(dl, 2))
    for i, size in enumerate(mix.sizes):
        ids = [sid for s, sid in got if s == i]
        assert ids == [k % size for k in range(len(ids))]
    dl.close()


def test_mixture_json_resolves_relative_paths(sources, tmp_path: Path) -> None:
    spec = tmp_path / "conf" / "mixture.json"
    spec.parent.mkdir()
    rel = {n: os.path.relpath(p, spec.parent) for n, p in sources.items()}
    assert all(not os.path.isabs(r) for r in rel.values())
    spec.write_text(json.dumps({"format": "stoker-mixture/1", "sources": rel,
                                "weights": {"web": 3, "code": 2, "books": 1},
                                "schedule": [[100, {"web": 1, "code": 1, "books": 1}]]}))
    from_file = DataLoader(str(spec), batch_size=16, shuffle=True, seed=2)
    direct = DataLoader(Mixture({n: str(p) for n, p in sources.items()},
                                {"web": 3, "code": 2, "books": 1},
                                [(100, {"web": 1, "code": 1, "books": 1})]),
                        batch_size=16, shuffle=True, seed=2)
    assert from_file.state_dict()["fingerprint"] == direct.state_dict()["fingerprint"]
    assert pairs(_epochs(from_file, 2)) == pairs(_epochs(direct, 2))
    from_file.close()
    direct.close()


def test_pinned_transfer_keeps_the_stream(sources) -> None:
    mix = _mixture(sources)
    ref = pairs(_epochs(DataLoader(mix, batch_size=16, shuffle=True, seed=4), 1))
    device = "cuda" if torch.cuda.is_available() else None
    dl = DataLoader(mix, batch_size=16, shuffle=True, seed=4, pin_memory=True, device=device,
                    num_workers=2)
    batches = _epochs(dl, 1)
    assert pairs({k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in b.items()}
                 for b in batches) == ref
    if device:
        assert batches[0]["source"].device.type == "cuda"
    dl.close()


def test_a_far_epoch_is_read_exactly(sources) -> None:
    mix = _mixture(sources)
    epoch = 10**10 // mix.num_samples  # positions near 10**10 of the stream
    dl = DataLoader(mix, batch_size=16, shuffle=True, seed=13, world_size=2, rank=1)
    dl.set_epoch(epoch)
    first = [pairs([b]) for _, b in zip(range(3), dl)]
    start = epoch * mix.num_samples
    whole = expected(mix, 13, start, start + 96, dl.order_options)
    assert first == [whole[s * 32 + 1:(s + 1) * 32:2] for s in range(3)]
    dl.close()


@pytest.mark.remote
def test_a_remote_source_is_cached_and_read_on_its_own(sources, nginx, tmp_path: Path) -> None:
    server = nginx(sources["code"])
    mix = Mixture({"web": str(sources["web"]), "code": server.url,
                   "books": str(sources["books"])}, WEIGHTS)
    dl = DataLoader(mix, batch_size=16, shuffle=True, seed=9, num_workers=2,
                    cache=tmp_path / "cache")
    assert not dl._source.union  # a remote source has its own reader and cache
    got = pairs(_epochs(dl, 3))
    assert got == expected(mix, 9, 0, 3 * mix.num_samples, dl.order_options)
    dl.close()
    shards = [r.uri for r in server.requests() if r.uri.startswith("/shards/")]
    assert sorted(shards) == ["/shards/00000.arrow", "/shards/00001.arrow"]  # once each


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_workers_read_groups_of_a_mixture_byte_for_byte(sources, mode: str) -> None:
    """Fixed-width columns of sources sharing one reader: workers read several batches per
    record gather (MixtureSource.fetch_group); every batch, ``"source"`` included, equals
    what num_workers=0 reads. Process workers are forked after the loader's process opened
    the shards of their first tasks."""
    from stoker.loader import ReadOptions

    mix = _mixture(sources)
    kw = dict(batch_size=16, shuffle=True, seed=3, columns=["id", "x"],
              read=ReadOptions(row_major=True))
    base = DataLoader(mix, **kw)
    ref = [{k: v.clone() for k, v in b.items()} for b in _epochs(base, 2)]
    base.close()
    dl = DataLoader(mix, num_workers=2, workers=WorkerOptions(mode=mode),
                    persistent_workers=mode == "process", **kw)
    assert dl._source.union and dl._group() > 1
    got = _epochs(dl, 2)
    if mode == "thread":
        assert dl._source.readers[0].batches_grouped > 0
    else:
        assert dl._pool.grouped > 0 and dl._source.readers[0].opened_shards
    dl.close()
    assert len(got) == len(ref) and list(got[0]) == list(ref[0]) == ["id", "x", "source"]
    for a, b in zip(got, ref):
        for key in a:
            assert a[key].dtype == b[key].dtype and a[key].numpy().tobytes() == \
                b[key].numpy().tobytes(), key
