"""The shared WebDataset column rules read a sample's span as WebDataset itself groups it."""

from __future__ import annotations

import io
import tarfile

import pytest

from stoker.manifest import SampleFormatError, parse_members


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize("key", ["a", "dir/s0001", "d" * 120 + "/long_key"])
def test_parse_members_matches_webdataset(key: str) -> None:
    from webdataset.tariterators import group_by_keys, tar_file_iterator

    data = _tar([(f"{key}.JPG", b"\xff\xd8"), (f"{key}.cls", b"3"), (f"{key}.seg.png", b"p"),
                 ("__meta__", b"skipped")])
    theirs = [dict(s) for s in group_by_keys(
        {**m, "__url__": "x"} for m in tar_file_iterator(io.BytesIO(data)))]
    for s in theirs:
        s.pop("__url__")
    assert [parse_members(data)] == theirs
    assert parse_members(data) == {"__key__": key, "jpg": b"\xff\xd8", "cls": b"3",
                                   "seg.png": b"p"}


@pytest.mark.parametrize("members, match", [
    ([("a.jpg", b"1"), ("b.jpg", b"2")], r"span holds samples 'a' and 'b'"),
    ([("noext", b"1")], r"member 'noext' has no extension"),
    ([("a.jpg", b"1"), ("a.JPG", b"2")], r"duplicate file 'a\.JPG'"),
    ([("__meta__", b"1")], r"holds no sample"),
])
def test_parse_members_errors_name_the_file_and_the_problem(members: list, match: str) -> None:
    with pytest.raises(SampleFormatError, match=r"'x\.tar': .*" + match):
        parse_members(_tar(members), "x.tar")


def test_parse_members_rejects_bytes_that_are_not_tar_members() -> None:
    with pytest.raises(SampleFormatError, match=r"'x\.tar': the span is not tar members"):
        parse_members(b"\x01" * 700, "x.tar")
