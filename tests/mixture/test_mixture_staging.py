"""A shuffled mixture beyond the records budget stages each source's rounds
(stoker.loader.read.mixture_staging): the same bytes as reading the columns, every worker mode,
rank and resume; its default partitions fit the sources' summed staging."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from mixture_helpers import expected, make_source, pairs, pairs_until
from stoker.loader import DataLoader, ReadOptions, ShuffleOptions, WorkerOptions
from stoker.loader.order.mixture import Mixture
from stoker.loader.order.mixture_order import source_options
from stoker.loader.order.options import OrderOptions
from stoker.loader.order.working_set import PARTITION_LADDER, STAGING_LIMIT
from stoker.loader.read.mixture_budget import mixture_plan, mixture_working_set
from stoker.loader.read.mixture_staging import MixtureStager
from stoker.loader.read.order_plan import OrderPlan, WorkingSetError

# blocks of 16 in 4 partitions: "web" has 22 blocks per pass, "code" 8, "books" 3, and books
# is drawn ~6 passes per epoch, so batches cross blocks and passes all the time
SHUFFLE = ShuffleOptions(partitions=4, block_size=16)
KW = dict(batch_size=16, seed=5, columns=["id", "x", "seq"])
MISSES = ("ids_not_staged", "mixture_unstaged")


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Mixture:
    root = tmp_path_factory.mktemp("mixstage")
    make_source(root / "web", [200, 310, 170, 290, 400], salt=0)
    make_source(root / "code", [160, 240, 100], salt=1)
    make_source(root / "books", [60, 70], salt=2)
    return Mixture({n: str(root / n) for n in ("web", "code", "books")},
                   {"web": math.sqrt(2), "code": math.sqrt(3), "books": math.sqrt(5)},
                   schedule=[(2500, {"web": 1, "code": 1, "books": 7})])


def _read(dl: DataLoader, epochs: int = 3) -> list[dict]:
    out = []
    for e in range(epochs):
        dl.set_epoch(e)
        out += [{k: v.clone() if hasattr(v, "clone") else list(v) for k, v in b.items()}
                for b in dl]
    return out


def _same(got: list[dict], ref: list[dict]) -> None:
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert list(a) == list(b)
        for key in a:
            assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape and \
                a[key].numpy().tobytes() == b[key].numpy().tobytes(), key


def _columns(mix: Mixture, **kw) -> list[dict]:
    """The reference: every row read from the shards' columns (no records, no staging)."""
    dl = DataLoader(mix, shuffle=SHUFFLE, read=ReadOptions(row_major=False), **KW, **kw)
    assert dl._source.readers[0].stager is None
    try:
        return _read(dl)
    finally:
        dl.close()


@pytest.mark.parametrize("kw", [{}, {"num_workers": 2},
                                {"num_workers": 2, "workers": WorkerOptions(mode="process"),
                                 "persistent_workers": True}],
                         ids=["w0", "threads", "processes"])
def test_staged_mixture_reads_the_bytes_the_columns_hold(big: Mixture, kw: dict) -> None:
    ref = _columns(big)
    dl = DataLoader(big, shuffle=SHUFFLE, read=ReadOptions(row_major="staged"), **KW, **kw)
    stager = dl._source.readers[0].stager
    assert isinstance(stager, MixtureStager)
    got = _read(dl)
    assert not any(k in dl.stats.fallbacks for k in MISSES), dl.stats.fallbacks
    if "workers" not in kw:  # rounds staged in this process (fixed-width "id" and "x")
        assert stager.rounds_staged > 0 and {"id", "x"} <= {f.name for f in stager.fields}
    dl.close()
    _same(got, ref)


@pytest.mark.parametrize("world", [2, 4])
def test_each_rank_stages_its_own_partitions(big: Mixture, world: int) -> None:
    for rank in range(world):
        kw = dict(rank=rank, world_size=world, batch_size=4)
        col = DataLoader(big, shuffle=SHUFFLE, read=ReadOptions(row_major=False), seed=5,
                         columns=["id", "x", "seq"], **kw)
        ref = _read(col)
        col.close()
        dl = DataLoader(big, shuffle=SHUFFLE, read=ReadOptions(row_major="staged"), seed=5,
                        columns=["id", "x", "seq"], **kw)
        got = _read(dl)
        assert not any(k in dl.stats.fallbacks for k in MISSES), (rank, dl.stats.fallbacks)
        dl.close()
        _same(got, ref)


@pytest.mark.parametrize("stop", [7, 150, 240])
def test_staged_resume_continues_exactly(big: Mixture, stop: int) -> None:
    kw = dict(shuffle=SHUFFLE, read=ReadOptions(row_major="staged"), **KW)
    ref = pairs(_read(DataLoader(big, **kw), 2))
    got, state = pairs_until(DataLoader(big, num_workers=2, **kw), stop)
    resumed = DataLoader(big, **kw)
    resumed.load_state_dict(state)
    while resumed.epoch < 2:
        got += pairs(resumed)
    assert not any(k in resumed.stats.fallbacks for k in MISSES)
    resumed.close()
    assert got == ref


def test_beyond_the_records_budget_a_mixture_stages(sources, monkeypatch) -> None:
    """Records over the budget: the mixture stages (no ``"mixture_unstaged"``), and reads
    the written rule."""
    from stoker.loader.fastpath import rowmajor

    mix = Mixture({n: str(p) for n, p in sources.items()},
                  {"web": math.sqrt(2), "code": math.sqrt(3), "books": math.sqrt(5)})
    monkeypatch.setattr(rowmajor, "AUTO_BUDGET_BYTES", 64)
    dl = DataLoader(mix, batch_size=16, shuffle=True, seed=11)
    assert isinstance(dl._source.readers[0].stager, MixtureStager)
    got = pairs(_read(dl, 2))
    assert got == expected(mix, 11, 0, 2 * mix.num_samples, dl.order_options)
    assert not any(k in dl.stats.fallbacks for k in MISSES), dl.stats.fallbacks
    dl.close()


def _manifest(rows: list[int]) -> SimpleNamespace:
    return SimpleNamespace(shard_rows=np.array(rows, dtype=np.int64),
                           shard_bytes=np.array(rows, dtype=np.int64) * 400)


def _plan(manifests: list[SimpleNamespace], stride: int) -> OrderPlan:
    rows = np.concatenate([m.shard_rows for m in manifests])
    options = OrderOptions(partitions=720, block_size=1024).resolve(rows)
    return OrderPlan(options, mixture_working_set(manifests, options, stride), stride)


def test_default_partitions_fit_the_sources_summed_staging() -> None:
    """Three 2 M-row sources of 600-byte records, staged source by source: each stages rounds
    of its share of the partitions, and the default is the largest P whose summed staging
    fits the limit (here below the ladder's top, which would not)."""
    manifests = [_manifest([250_000] * 8) for _ in range(3)]
    plan = mixture_plan(manifests, ["a", "b", "c"], _plan(manifests, 600), partitions=None,
                        world_size=1)
    P = plan.options.partitions
    assert plan.working_set.staging_bytes <= STAGING_LIMIT
    assert plan.working_set == mixture_working_set(manifests, plan.options, 600)
    larger = [p for p in PARTITION_LADDER if p > P]
    assert larger and mixture_working_set(
        manifests, OrderOptions(partitions=min(larger), block_size=1024),
        600).staging_bytes > STAGING_LIMIT
    # equal sources take a third of the partitions each: their staging is three datasets'
    # of their own at P / 3
    assert [o.partitions for o in source_options(plan.options, [2_000_000] * 3)] == [P // 3] * 3
    one = mixture_working_set(manifests[:1], OrderOptions(partitions=P // 3, block_size=1024),
                              600)
    assert plan.working_set.staging_bytes == 3 * one.staging_bytes


def test_explicit_partitions_that_do_not_fit_are_refused() -> None:
    manifests = [_manifest([250_000] * 8), _manifest([100_000] * 4)]
    with pytest.raises(WorkingSetError) as err:
        mixture_plan(manifests, ["web", "code"], _plan(manifests, 392), partitions=720,
                     world_size=2, memory=400 << 20)
    text = str(err.value)
    assert "web: " in text and "code: " in text and "partitions=720" in text
    fit = int(text.split("ShuffleOptions(partitions=")[-1].split(")")[0])
    assert fit < 720 and mixture_working_set(
        manifests, OrderOptions(partitions=fit, block_size=1024), 392).staging_bytes \
        <= 400 << 20 and fit % 2 == 0
