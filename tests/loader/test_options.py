"""DataLoader's signature (torch 2.13's, plus at most ten of stoker's own), its option objects,
and the old keyword spellings that keep working for one release."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest
import torch

from stoker.loader import (CacheOptions, DataLoader, LedgerOptions, OptionsError, ReadOptions,
                           ShuffleOptions, StokerDeprecationWarning, WorkerOptions)
from stoker.loader.options.resolve import LEGACY
from stoker.loader.order.epoch import OrderError

OWN = ["seed", "columns", "transform", "rank", "world_size", "device", "cache", "ledger", "read",
       "workers"]


def _params(cls: type) -> dict[str, inspect.Parameter]:
    return {n: p for n, p in inspect.signature(cls.__init__).parameters.items() if n != "self"}


def test_the_signature_covers_torchs_parameter_for_parameter() -> None:
    ours, torchs = _params(DataLoader), _params(torch.utils.data.DataLoader)
    assert "in_order" in torchs  # torch 2.13
    for name, p in torchs.items():
        assert name in ours, name
        assert (ours[name].kind, ours[name].default) == (p.kind, p.default), name
    # torch's parameters come first, in torch's order: positional calls mean the same thing
    assert list(ours)[:len(torchs)] == list(torchs)


def test_stoker_adds_at_most_ten_arguments_of_its_own() -> None:
    ours, torchs = _params(DataLoader), _params(torch.utils.data.DataLoader)
    own = [n for n, p in ours.items() if n not in torchs and p.kind != p.VAR_KEYWORD]
    assert own == OWN and len(own) <= 10
    assert all(ours[n].kind == inspect.Parameter.KEYWORD_ONLY for n in own)
    # the old spellings are not in the signature: they arrive through **deprecated
    assert not set(LEGACY) & set(ours)


# every old keyword, a value for it, and the same loader in the new spelling
LEGACY_CASES: list[tuple[dict[str, Any], dict[str, Any]]] = [
    (dict(features=["x"]), dict(read=ReadOptions(features=["x"]))),
    (dict(categoricals=["y"]), dict(read=ReadOptions(categoricals=["y"]))),
    (dict(image=None), dict(read=ReadOptions())),
    (dict(row_major=False), dict(read=ReadOptions(row_major=False))),
    (dict(row_major_dir=False), dict(read=ReadOptions(records_dir=False))),
    (dict(shuffle=True, partitions=4), dict(shuffle=ShuffleOptions(partitions=4))),
    (dict(shuffle=True, block_size=7), dict(shuffle=ShuffleOptions(block_size=7))),
    (dict(shuffle=True, partition_mode="fixed"),
     dict(shuffle=ShuffleOptions(partition_mode="fixed"))),
    (dict(cache_dir="CACHE"), dict(cache="CACHE")),
    (dict(cache_dir="CACHE", cache_limit="64MiB"),
     dict(cache=CacheOptions(dir="CACHE", limit=64 << 20))),
    (dict(storage_options={"anon": True}),
     dict(cache=CacheOptions(storage_options={"anon": True}))),
    (dict(cache_options={"prefetch_workers": 0}), dict(cache=CacheOptions(prefetch_workers=0))),
    (dict(ledger="LEDGER", ledger_ids=True), dict(ledger=LedgerOptions("LEDGER", ids=True))),
    (dict(ledger="LEDGER", ledger_content=False),
     dict(ledger=LedgerOptions("LEDGER", content=False))),
    (dict(worker_mode="process"), dict(workers=WorkerOptions(mode="process"))),
    (dict(sample_seeding=False), dict(workers=WorkerOptions(sample_seeding=False))),
    (dict(service=["grpc://127.0.0.1:1"]),
     dict(workers=WorkerOptions(service=["grpc://127.0.0.1:1"]))),
]


def _paths(kw: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """Put the placeholders CACHE and LEDGER under ``tmp``."""
    def fix(v: Any) -> Any:
        if isinstance(v, str) and v in ("CACHE", "LEDGER"):
            return str(tmp / v)
        if dataclasses.is_dataclass(v):
            return dataclasses.replace(v, **{f.name: fix(getattr(v, f.name))
                                             for f in dataclasses.fields(v)
                                             if isinstance(getattr(v, f.name), str)})
        return v
    return {k: fix(v) for k, v in kw.items()}


def test_every_old_keyword_has_a_case() -> None:
    assert {k for old, _ in LEGACY_CASES for k in old} - {"ledger", "shuffle"} == set(LEGACY)


@pytest.mark.parametrize(("old", "new"), LEGACY_CASES, ids=[",".join(o) for o, _ in LEGACY_CASES])
def test_an_old_keyword_warns_and_means_the_new_spelling(dataset: Path, tmp_path: Path,
                                                         old: dict[str, Any],
                                                         new: dict[str, Any]) -> None:
    old, new = _paths(old, tmp_path), _paths(new, tmp_path)
    with pytest.warns(StokerDeprecationWarning) as seen:
        was = DataLoader(str(dataset), batch_size=8, **old)
    moved = [k for k in old if k in LEGACY]
    assert len(seen) == len(moved)
    for w, key in zip(seen, moved):
        keyword, cls, _ = LEGACY[key]
        assert f"DataLoader({key}=...) is deprecated" in str(w.message)
        assert f"pass {keyword}={cls.__name__}(" in str(w.message)
        assert w.filename == __file__  # points at the caller's line
    now = DataLoader(str(dataset), batch_size=8, **new)
    try:
        assert was._options == now._options
    finally:
        was.close()
        now.close()


def test_old_and_new_spellings_give_the_same_batches(dataset: Path) -> None:
    def epoch(**kw: Any) -> list[dict[str, torch.Tensor]]:
        dl = DataLoader(str(dataset), batch_size=16, seed=4, **kw)
        out = [dict(b) for b in dl]
        dl.close()
        return out

    with pytest.warns(StokerDeprecationWarning):
        old = epoch(shuffle=True, partitions=4, block_size=8, features=["x", "y"])
    new = epoch(shuffle=ShuffleOptions(partitions=4, block_size=8),
                read=ReadOptions(features=["x", "y"]))
    other = epoch(shuffle=ShuffleOptions(partitions=2, block_size=8),
                  read=ReadOptions(features=["x", "y"]))
    assert len(old) == len(new) > 1
    for a, b in zip(old, new):
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a if isinstance(a[k], torch.Tensor))
    # the comparison sees a different order
    assert any(not torch.equal(a["id"], c["id"]) for a, c in zip(new, other))


def test_an_old_keyword_beside_its_option_object_is_refused(dataset: Path) -> None:
    with pytest.raises(OptionsError, match=r"both read=.*old keyword\(s\) features="), \
            pytest.warns(StokerDeprecationWarning):
        DataLoader(str(dataset), read=ReadOptions(row_major=False), features=["x"])
    with pytest.raises(OptionsError, match="both shuffle="), \
            pytest.warns(StokerDeprecationWarning):
        DataLoader(str(dataset), shuffle=ShuffleOptions(partitions=2), partitions=4)


def test_an_unknown_keyword_is_a_type_error_as_for_any_function(dataset: Path) -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'shufle'"):
        DataLoader(str(dataset), shufle=True)


@pytest.mark.parametrize(("make", "error", "match"), [
    (lambda: ReadOptions(features="x"), OptionsError, "features='x' must be a list"),
    (lambda: ReadOptions(categoricals=[1]), OptionsError, "categoricals=.*list of column names"),
    (lambda: ReadOptions(image="jpg"), OptionsError, "ImageOptions"),
    (lambda: ReadOptions(row_major="yes"), OptionsError, "row_major='yes' is not supported"),
    (lambda: ReadOptions(records_dir=3), OptionsError, "records_dir=3 must be a path"),
    (lambda: ShuffleOptions(partitions=0), OrderError, "partitions must be a positive int"),
    (lambda: ShuffleOptions(block_size=-1), OrderError, "block_size must be an int >= 0"),
    (lambda: ShuffleOptions(partition_mode="random"), OrderError, "partition_mode must be"),
    (lambda: CacheOptions(limit="lots"), OptionsError, "cache limit"),
    (lambda: CacheOptions(inflight_allowance=-1), OptionsError, "inflight_allowance"),
    (lambda: CacheOptions(storage_options=[("anon", True)]), OptionsError, "mapping"),
    (lambda: LedgerOptions(3), OptionsError, "ledger path"),
    (lambda: LedgerOptions("x", ids="yes"), OptionsError, "LedgerOptions.ids='yes'"),
    (lambda: WorkerOptions(mode="fork"), OptionsError, "worker mode 'fork' is not supported"),
    (lambda: WorkerOptions(sample_seeding=1), OptionsError, "sample_seeding=1"),
    (lambda: WorkerOptions(service=42), TypeError, "service= must be a list of server URLs"),
])
def test_option_objects_check_their_values(make: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        make()
    assert issubclass(error, (ValueError, TypeError))  # what torch code catches


def test_option_objects_are_frozen_and_normalised() -> None:
    read = ReadOptions(features=["a", "b"], records_dir=Path("/r"))
    assert read.features == ("a", "b") and read.records_dir == "/r"
    assert CacheOptions(limit="1KiB").limit == 1024
    with pytest.raises(dataclasses.FrozenInstanceError):
        read.features = ("c",)  # type: ignore[misc]
    assert ShuffleOptions() and hash(ShuffleOptions(partitions=4))  # truthy: it means shuffle


def test_a_group_must_be_its_option_object(dataset: Path) -> None:
    with pytest.raises(OptionsError, match=r"read=\{'features': \['x'\]\} must be a ReadOptions"):
        DataLoader(str(dataset), read={"features": ["x"]})
    with pytest.raises(OptionsError, match="cache=3 must be a path or a CacheOptions"):
        DataLoader(str(dataset), cache=3)


def test_read_options_apply_to_stoker_datasets_only() -> None:
    with pytest.raises(ValueError, match="read=ReadOptions"):
        DataLoader(list(range(10)), read=ReadOptions(features=["x"]))


def test_shuffle_options_mean_shuffle_on(dataset: Path) -> None:
    dl = DataLoader(str(dataset), batch_size=8, seed=1, shuffle=ShuffleOptions(partitions=4))
    try:
        assert dl.order_options.shuffle and dl.order_options.partitions == 4
    finally:
        dl.close()


def test_shuffle_options_with_an_iterable_dataset_are_refused_as_torch_refuses_shuffle() -> None:
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(range(4))

    with pytest.raises(ValueError, match="expected unspecified shuffle option"):
        DataLoader(Stream(), shuffle=ShuffleOptions())


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_process_workers_over_a_stoker_dataset_refuse_a_context_that_does_not_fork(
        dataset: Path, context: str) -> None:
    """They inherit the open source, which a spawned worker cannot be sent: refused at
    construction, by name (it was a pickling TypeError at the first batch)."""
    import multiprocessing

    for ctx in (context, multiprocessing.get_context(context)):
        with pytest.raises(OptionsError, match=rf"multiprocessing_context='{context}': process "
                           r"workers over a stoker dataset are forked .* WorkerOptions\("
                           r"mode='thread'\)"):
            DataLoader(str(dataset), batch_size=8, num_workers=2, multiprocessing_context=ctx,
                       workers=WorkerOptions(mode="process"))
    for ok in (dict(multiprocessing_context="fork"), dict(workers=WorkerOptions(mode="thread"))):
        kw: dict[str, Any] = {"multiprocessing_context": context,
                              "workers": WorkerOptions(mode="process"), **ok}
        loader = DataLoader(str(dataset), batch_size=8, num_workers=2, **kw)
        assert len(list(loader)) == len(loader)
        loader.close()
