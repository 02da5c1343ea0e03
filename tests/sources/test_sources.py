"""WebDataset, image-folder, Hugging Face and token sources: content, detection, determinism."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from source_fixtures import (dataset_bytes, expected_tar_rows, read_dataset, tar_bytes,
                             write_hf, write_image_folder, write_tars)

from stoker.manifest import Manifest
from stoker.sharder import SharderError, shard
from stoker.sharder.errors import ShardOptionsError
from stoker.tools.cli import main
from stoker.loader.options import ReadOptions


# -- WebDataset --------------------------------------------------------------------------
@pytest.mark.parametrize("compress", ["none", "gz", "zst"])
def test_webdataset_keys_become_typed_columns(tmp_path: Path, compress: str) -> None:
    write_tars(tmp_path / "src", compress=compress)
    manifest = shard(tmp_path / "src", tmp_path / "out", rows_per_shard=10)
    table = read_dataset(tmp_path / "out")
    assert manifest.provenance["options"]["format"] == "webdataset"
    assert table.schema == pa.schema([pa.field("__key__", pa.string(), False),
                                      pa.field("cls", pa.int64(), False),
                                      pa.field("jpg", pa.binary(), False),
                                      pa.field("json", pa.string(), False),
                                      pa.field("txt", pa.string(), False)])
    assert table.to_pylist() == expected_tar_rows()
    assert list(manifest.shard_rows) == [10, 10, 10, 10, 2]


def test_webdataset_matches_what_the_webdataset_package_reads(tmp_path: Path) -> None:
    import webdataset as wds

    paths = write_tars(tmp_path / "src", counts=(6, 5))
    shard(tmp_path / "src", tmp_path / "out", rows_per_shard=4)
    ours = read_dataset(tmp_path / "out").to_pylist()
    theirs = list(wds.WebDataset([str(p) for p in paths], shardshuffle=False, empty_check=False))
    assert [r["__key__"] for r in ours] == [s["__key__"] for s in theirs]
    assert [r["jpg"] for r in ours] == [s["jpg"] for s in theirs]
    assert [r["txt"].encode() for r in ours] == [s["txt"] for s in theirs]


def test_webdataset_byte_identical_across_workers(tmp_path: Path) -> None:
    write_tars(tmp_path / "src", compress="zst")
    shard(tmp_path / "src", tmp_path / "a", rows_per_shard=7)
    shard(tmp_path / "src", tmp_path / "b", rows_per_shard=7, workers=2)
    assert dataset_bytes(tmp_path / "a") == dataset_bytes(tmp_path / "b")


def test_webdataset_missing_key_is_an_error_naming_the_sample(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    samples = [("a", {"jpg": b"1", "cls": b"0"}), ("b", {"jpg": b"2"}), ("c", {"jpg": b"3", "cls": b"1"})]
    (tmp_path / "src" / "x.tar").write_bytes(tar_bytes(samples))
    with pytest.raises(SharderError, match=r"x\.tar.*sample 'b'.*missing \['cls'\]"):
        shard(tmp_path / "src", tmp_path / "out")
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_webdataset_tars_with_different_keys_are_a_schema_mismatch(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.tar").write_bytes(tar_bytes([("a", {"jpg": b"1", "cls": b"0"})]))
    (tmp_path / "src" / "b.tar").write_bytes(tar_bytes([("b", {"jpg": b"1"})]))
    with pytest.raises(SharderError, match=r"field 'cls' is in .*a\.tar.* but not in .*b\.tar"):
        shard(tmp_path / "src", tmp_path / "out")


@pytest.mark.parametrize("files, match", [
    ({"cls": b"seven"}, r"sample 'a' file \.cls is not an ASCII integer"),
    ({"txt": b"\xff\xfe"}, r"sample 'a' file \.txt is not UTF-8 text"),
])
def test_webdataset_bad_typed_values_are_errors(tmp_path: Path, files: dict, match: str) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.tar").write_bytes(tar_bytes([("a", files)]))
    with pytest.raises(SharderError, match=match):
        shard(tmp_path / "src", tmp_path / "out")


def test_webdataset_member_without_extension_and_corrupt_tar(tmp_path: Path) -> None:
    import io
    import tarfile

    (tmp_path / "src").mkdir()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("noext")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    (tmp_path / "src" / "a.tar").write_bytes(buf.getvalue())
    with pytest.raises(SharderError, match=r"member 'noext' has no extension"):
        shard(tmp_path / "src", tmp_path / "out")
    good = tar_bytes([("a", {"jpg": b"1" * 3000})])
    (tmp_path / "src" / "a.tar").write_bytes(good[:1500])
    with pytest.raises(SharderError, match=r"a\.tar"):
        shard(tmp_path / "src", tmp_path / "out", overwrite=True)


# -- image folders -----------------------------------------------------------------------
def test_image_folder_classes_labels_paths(tmp_path: Path) -> None:
    files = write_image_folder(tmp_path / "imgs")
    manifest = shard(tmp_path / "imgs", tmp_path / "out", rows_per_shard=4)
    assert manifest.classes == ["bird", "cat", "dog"]
    assert manifest.provenance["options"]["format"] == "imagefolder"
    assert [s["path"] for s in manifest.provenance["sources"]] == ["bird", "cat", "dog"]
    rows = read_dataset(tmp_path / "out").to_pylist()
    expected = sorted(files, key=lambda rel: (rel.split("/")[0], rel.split("/", 1)[1]))
    assert [r["path"] for r in rows] == expected
    assert [r["label"] for r in rows] == [manifest.classes.index(p.split("/")[0]) for p in expected]
    assert all(r["image"] == files[r["path"]] for r in rows)  # bytes as stored, mixed sizes


def test_image_folder_decodes_through_the_loader(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    from stoker.loader import DataLoader
    from stoker.loader.fastpath.images import ImageOptions

    write_image_folder(tmp_path / "imgs")
    shard(tmp_path / "imgs", tmp_path / "out")
    loader = DataLoader(str(tmp_path / "out"), batch_size=15, shuffle=False,
                        read=ReadOptions(image=ImageOptions(column="image", size=(8, 8))))
    batch = next(iter(loader))
    assert tuple(batch["image"].shape) == (15, 8, 8, 3)
    assert batch["label"].tolist() == [0] * 6 + [1] * 4 + [2] * 5


def test_image_folder_bad_inputs_are_errors(tmp_path: Path) -> None:
    root = tmp_path / "imgs"
    write_image_folder(root)
    (root / "empty").mkdir()
    with pytest.raises(SharderError, match=r"class folder .*empty.* holds no images"):
        shard(root, tmp_path / "out", format="imagefolder")
    (root / "empty").rmdir()
    (root / "cat" / "broken.jpg").write_bytes(b"this is not a jpeg")
    with pytest.raises(SharderError, match=r"broken\.jpg.* is not a readable image"):
        shard(root, tmp_path / "out", format="imagefolder", overwrite=True)
    (root / "cat" / "broken.jpg").unlink()
    (root / "cat" / "notes.txt").write_text("hi")
    with pytest.raises(SharderError, match=r"notes\.txt.* is not an image"):
        shard(root, tmp_path / "out", format="imagefolder", overwrite=True)


def test_image_folder_byte_identical_across_workers(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "imgs")
    shard(tmp_path / "imgs", tmp_path / "a", rows_per_shard=4)
    shard(tmp_path / "imgs", tmp_path / "b", rows_per_shard=4, workers=2)
    assert dataset_bytes(tmp_path / "a") == dataset_bytes(tmp_path / "b")


# -- Hugging Face save_to_disk ------------------------------------------------------------
def test_hf_saved_dataset_is_detected_and_read_without_datasets(tmp_path: Path) -> None:
    expected = write_hf(tmp_path / "hf")
    manifest = shard(tmp_path / "hf", tmp_path / "out", rows_per_shard=30)
    assert manifest.provenance["options"]["format"] == "hf"
    assert [s["path"] for s in manifest.provenance["sources"]] == \
        ["data-00000-of-00002.arrow", "data-00001-of-00002.arrow"]
    assert read_dataset(tmp_path / "out").equals(expected)
    assert list(manifest.shard_rows) == [30, 30, 5]


def test_hf_dataset_dict_and_indices_are_refused(tmp_path: Path) -> None:
    write_hf(tmp_path / "dd" / "train")
    (tmp_path / "dd" / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    with pytest.raises(SharderError, match=r"DatasetDict with splits \['train'\]"):
        shard(tmp_path / "dd", tmp_path / "out")
    state = json.loads((tmp_path / "dd" / "train" / "state.json").read_text())
    state["_indices_data_files"] = [{"filename": "indices.arrow"}]
    (tmp_path / "dd" / "train" / "state.json").write_text(json.dumps(state))
    with pytest.raises(SharderError, match="flatten_indices"):
        shard(tmp_path / "dd" / "train", tmp_path / "out")


# -- token files ---------------------------------------------------------------------------
def test_tokens_npy_fixed_length_sequences_and_tail_rule(tmp_path: Path) -> None:
    (tmp_path / "tok").mkdir()
    a = np.arange(1000, dtype=np.uint16)
    b = np.arange(5000, 5250, dtype=np.uint16)
    np.save(tmp_path / "tok" / "a.npy", a)
    np.save(tmp_path / "tok" / "b.npy", b)
    manifest = shard(tmp_path / "tok", tmp_path / "out", seq_len=64, rows_per_shard=5)
    table = read_dataset(tmp_path / "out")
    assert table.schema.field("tokens").type == pa.list_(pa.uint16(), 64)
    got = np.stack(table.column("tokens").to_numpy(zero_copy_only=False))
    expected = np.concatenate([a[:15 * 64].reshape(15, 64), b[:3 * 64].reshape(3, 64)])
    assert np.array_equal(got, expected)
    opts = manifest.provenance["options"]
    assert (opts["seq_len"], opts["token_dtype"], opts["token_tail"], opts["dropped_tokens"]) \
        == (64, "uint16", "drop", 1000 - 15 * 64 + 250 - 3 * 64)


def test_tokens_raw_bin_needs_a_dtype_and_loads_as_tensors(tmp_path: Path) -> None:
    from stoker.loader import DataLoader

    tokens = np.arange(70000, 70000 + 4096, dtype=np.uint32)
    tokens.tofile(tmp_path / "train.bin")
    with pytest.raises(ShardOptionsError, match="--token-dtype"):
        shard(tmp_path / "train.bin", tmp_path / "out", seq_len=128)
    with pytest.raises(ShardOptionsError, match="--seq-len"):
        shard(tmp_path / "train.bin", tmp_path / "out", token_dtype="uint32")
    shard(tmp_path / "train.bin", tmp_path / "out", token_dtype="uint32", seq_len=128)
    batch = next(iter(DataLoader(str(tmp_path / "out"), batch_size=4, shuffle=False)))
    assert batch["tokens"].shape == (4, 128)
    assert np.array_equal(batch["tokens"].numpy().astype(np.int64),
                          tokens[:512].reshape(4, 128).astype(np.int64))


def test_tokens_wrong_dtype_and_options_on_other_formats(tmp_path: Path) -> None:
    np.save(tmp_path / "f.npy", np.arange(10, dtype=np.int64))
    with pytest.raises(SharderError, match="1-D uint16 or uint32"):
        shard(tmp_path / "f.npy", tmp_path / "out", seq_len=2)
    np.save(tmp_path / "g.npy", np.arange(10, dtype=np.uint16))
    with pytest.raises(SharderError, match="holds uint16 tokens but --token-dtype is uint32"):
        shard(tmp_path / "g.npy", tmp_path / "out", seq_len=2, token_dtype="uint32")
    write_tars(tmp_path / "tars", counts=(2,))
    with pytest.raises(ShardOptionsError, match="apply to token files only"):
        shard(tmp_path / "tars", tmp_path / "out", seq_len=2)


# -- detection and the CLI -------------------------------------------------------------------
def test_cli_format_overrides_detection(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    data = tar_bytes([(f"k{i}", {"bin": bytes([i])}) for i in range(5)])
    (tmp_path / "src" / "shard.data").write_bytes(data)  # no tar extension
    assert main(["shard", str(tmp_path / "src" / "shard.data"), str(tmp_path / "out"),
                 "--quiet"]) == 1
    assert main(["shard", str(tmp_path / "src" / "shard.data"), str(tmp_path / "out"),
                 "--format", "webdataset", "--quiet"]) == 0
    assert Manifest.load(tmp_path / "out").num_samples == 5
    np.arange(300, dtype=np.uint16).tofile(tmp_path / "t.bin")
    assert main(["shard", str(tmp_path / "t.bin"), str(tmp_path / "tok"), "--token-dtype",
                 "uint16", "--seq-len", "100", "--quiet"]) == 0
    assert main(["shard", str(tmp_path / "t.bin"), str(tmp_path / "tok2"), "--quiet"]) == 2


def test_webdataset_offset_reads_equal_stream_reads(tmp_path: Path) -> None:
    """Uncompressed tars are read by byte spans, compressed ones as streams: same shards."""
    write_tars(tmp_path / "plain", long_keys=True)
    write_tars(tmp_path / "zst", compress="zst", long_keys=True)
    shard(tmp_path / "plain", tmp_path / "a", rows_per_shard=6, workers=2)
    shard(tmp_path / "zst", tmp_path / "b", rows_per_shard=6)
    shards_a = {k: v for k, v in dataset_bytes(tmp_path / "a").items() if k.startswith("shards/")}
    shards_b = {k: v for k, v in dataset_bytes(tmp_path / "b").items() if k.startswith("shards/")}
    assert len(shards_a) == 7 and shards_a == shards_b


def test_tar_layout_splits_names_like_webdataset() -> None:
    from webdataset import tariterators as wt

    from stoker.sharder.sources.tar_layout import base_plus_ext, is_meta

    names = ["a.jpg", "dir/a.b.c", "d.d/x.seg.png", "noext", "dir/", "__meta__", "__key__.txt",
             "x/__y__/z.txt", ".hidden", "a..b", "dir.v1/file", "é/ü.json", "a/b/c.d.e"]
    for name in names:
        assert base_plus_ext(name) == wt.base_plus_ext(name), name
        skipped = bool(__import__("re").match(r"__[^/]*__($|/)", name)) or (
            "/" not in name and name.startswith(wt.meta_prefix) and name.endswith(wt.meta_suffix))
        assert is_meta(name) == skipped, name


def test_image_folder_opt_in_skip_is_recorded(tmp_path: Path) -> None:
    root = tmp_path / "imgs"
    files = write_image_folder(root)
    (root / "cat" / "broken.jpg").write_bytes(b"this is not a jpeg")
    (root / "dog" / "notes.txt").write_text("hi")
    assert main(["shard", str(root), str(tmp_path / "out"), "--on-bad", "skip", "--quiet"]) == 0
    manifest = Manifest.load(tmp_path / "out")
    assert manifest.provenance["options"]["on_bad"] == "skip"
    assert manifest.provenance["options"]["skipped"] == [
        {"path": "cat/broken.jpg", "reason": "not a readable image (first bytes b'this is ')"},
        {"path": "dog/notes.txt", "reason": "not an image (extension)"}]
    rows = read_dataset(tmp_path / "out").to_pylist()
    assert sorted(r["path"] for r in rows) == sorted(files)
    shard(root, tmp_path / "two", on_bad="skip", rows_per_shard=4, workers=2)
    shard(root, tmp_path / "one", on_bad="skip", rows_per_shard=4)
    assert dataset_bytes(tmp_path / "one") == dataset_bytes(tmp_path / "two")
    with pytest.raises(ShardOptionsError, match="image folders only"):
        shard(tmp_path / "out" / "shards", tmp_path / "x", on_bad="skip", format="parquet")
