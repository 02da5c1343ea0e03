"""The mixture's warm-up loads exactly the kernel specialisations its batches then use."""

from __future__ import annotations

import math

from stoker.loader import DataLoader, ShuffleOptions
from stoker.loader.fastpath import warm
from stoker.loader.jit.kernel import materialize
from stoker.loader.order import blend_kernel, mixture_kernel
from stoker.loader.order.mixture import Mixture


def _signatures() -> dict[str, set]:
    kernels = {"run_blend": blend_kernel.run_blend, "run_blend_flat": blend_kernel.run_blend_flat,
               "pick_spans": mixture_kernel.pick_spans,
               "place": mixture_kernel.place, "source_of": mixture_kernel.source_of}
    return {name: set(k.signatures) for name, k in kernels.items()}


def test_a_mixture_epoch_compiles_nothing_the_warm_up_did_not(sources) -> None:
    materialize()
    warm._mixture()
    warmed = _signatures()
    assert all(warmed.values()), warmed
    mix = Mixture({n: str(p) for n, p in sources.items()},
                  {"web": math.sqrt(2), "code": 1, "books": 3})
    for kw in ({}, {"world_size": 2, "rank": 1}):
        dl = DataLoader(mix, batch_size=16, shuffle=ShuffleOptions(partitions=4), seed=2, **kw)
        assert sum(len(b["source"]) for b in dl) > 0
        dl.close()
    assert _signatures() == warmed
