"""Every bad mixture is refused at construction, with a message naming the thing and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from mixture_helpers import make_source
from stoker.loader import DataLoader, ReadOptions
from stoker.loader.order.mixture import Mixture, MixtureError
from stoker.manifest import ManifestError


def _src(sources) -> dict[str, str]:
    return {n: str(p) for n, p in sources.items()}


@pytest.mark.parametrize("weights, words", [
    ({"web": 1, "code": 0, "books": 1}, r"weights\['code'\]: weight 0 must be > 0"),
    ({"web": 1, "code": -2.5, "books": 1}, r"weights\['code'\]: weight -2.5 must be > 0"),
    ({"web": float("nan"), "code": 1, "books": 1}, r"weights\['web'\]: weight nan is not finite"),
    ({"web": 1, "code": 1, "books": "1"}, r"weights\['books'\]: weight '1' \(str\) is not a number"),
    ({"web": 1, "code": 1, "books": 1, "news": 2}, r"names 'news', which is not a source"),
    ({"web": 1, "code": 1}, r"weights lacks a weight for \['books'\]"),
])
def test_bad_weights(sources, weights, words: str) -> None:
    with pytest.raises(MixtureError, match=words):
        Mixture(_src(sources), weights)


@pytest.mark.parametrize("schedule, words", [
    ([(100, {"web": 1, "code": 1, "books": 1}), (100, {"web": 2, "code": 1, "books": 1})],
     r"schedule positions must increase: schedule\[1\] is at 100, after 100"),
    ([(300, {"web": 1, "code": 1, "books": 1}), (200, {"web": 2, "code": 1, "books": 1})],
     r"schedule\[1\] is at 200, after 300"),
    ([(-1, {"web": 1, "code": 1, "books": 1})], r"position -1 must be an int >= 0"),
    ([(10, {"web": 1, "code": 0, "books": 1})], r"schedule\[0\] weights\['code'\]: weight 0"),
    ([(10, {"web": 1, "code": 1, "book": 1})], r"names 'book', which is not a source"),
    ([(10,)], r"schedule\[0\] must be \(position, weights\)"),
])
def test_bad_schedules(sources, schedule, words: str) -> None:
    with pytest.raises(MixtureError, match=words):
        Mixture(_src(sources), None, schedule)


def test_weights_and_a_schedule_at_zero_conflict(sources) -> None:
    with pytest.raises(MixtureError, match="both set the starting weights"):
        Mixture(_src(sources), {"web": 1, "code": 1, "books": 1},
                [(0, {"web": 1, "code": 1, "books": 1})])


def test_an_empty_source_is_refused(sources, tmp_path: Path) -> None:
    make_source(tmp_path / "empty", [0])
    with pytest.raises(MixtureError, match="source 'empty' holds no samples"):
        Mixture({**_src(sources), "empty": str(tmp_path / "empty")})


def test_a_missing_source_names_it(sources, tmp_path: Path) -> None:
    with pytest.raises(MixtureError, match="source 'gone': .*no manifest found"):
        Mixture({**_src(sources), "gone": str(tmp_path / "nowhere")})


def test_incompatible_column_types_name_source_column_and_types(sources, tmp_path) -> None:
    make_source(tmp_path / "wide", [10], x_type=pa.float64())
    mix = Mixture({"web": str(sources["web"]), "wide": str(tmp_path / "wide")})
    with pytest.raises(ManifestError, match=r"column 'x' is float in source 'web' but double "
                                            r"in source 'wide'") as info:
        DataLoader(mix, batch_size=4)
    assert isinstance(info.value, MixtureError)
    DataLoader(mix, batch_size=4, columns=["id", "seq"]).close()  # leaving it out works
    DataLoader(mix, batch_size=4, columns=["id"], read=ReadOptions(features=["x"])).close()  # cast anyway


def test_a_column_missing_from_one_source(sources, tmp_path: Path) -> None:
    from shard_writer import write_dataset

    write_dataset(tmp_path / "thin", [pa.table({"id": pa.array([0, 1], pa.int64())})])
    mix = Mixture({"web": str(sources["web"]), "thin": str(tmp_path / "thin")})
    with pytest.raises(MixtureError, match="sources 'web' and 'thin' have different columns"):
        DataLoader(mix, batch_size=4)
    with pytest.raises(MixtureError, match="column 'x' is in source 'web' but not in source "
                                           "'thin'"):
        DataLoader(mix, batch_size=4, columns=["id", "x"])
    dl = DataLoader(mix, batch_size=4, columns=["id"])
    assert len(list(dl)) == len(dl)
    dl.close()


@pytest.mark.parametrize("doc, words", [
    ("{not json", "cannot read the mixture"),
    (json.dumps({"weights": {}}), "a JSON object with 'sources'"),
    (json.dumps({"format": "stoker-mixture/9", "sources": {"a": "x"}}), "is not "
     "'stoker-mixture/1'"),
    (json.dumps({"sources": {"a": "x"}, "weight": {}}), r"unknown key\(s\) \['weight'\]"),
    (json.dumps({"sources": {"a": 3}}), "every source is a dataset path or URL"),
])
def test_bad_mixture_files(tmp_path: Path, doc: str, words: str) -> None:
    path = tmp_path / "mixture.json"
    path.write_text(doc)
    with pytest.raises(MixtureError, match=words):
        Mixture.load(path)
