"""Image decode + augmentation: deterministic from (seed, epoch, sample id) only."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from PIL import Image

from stoker.loader import DataLoader, ReadOptions
from stoker.loader.read.arrow import ArrowSource
from stoker.loader.fastpath.images import ImageOptions
from stoker.manifest import Manifest

N = 40


def _jpeg(i: int, side: int) -> bytes:
    rng = np.random.default_rng(i)
    img = rng.integers(0, 256, (side, side + 4, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fastpath_helpers import write_dataset

    root = tmp_path_factory.mktemp("images")
    tables = [pa.table({"jpg": pa.array([_jpeg(i, 20) for i in range(lo, lo + 20)], pa.binary()),
                        "label": pa.array(np.arange(lo, lo + 20))}) for lo in (0, 20)]
    write_dataset(root, tables)
    return root


AUG = ImageOptions("jpg", size=(16, 16), crop=(0.3, 1.0), flip=True)


def _epoch(path: Path, epoch: int, **kw: object) -> list[dict[str, torch.Tensor]]:
    dl = DataLoader(path, batch_size=8, shuffle=True, seed=5, read=ReadOptions(image=AUG), **kw)  # type: ignore[arg-type]
    dl.set_epoch(epoch)
    out = [{k: v.clone() for k, v in b.items()} for b in dl]
    dl.close()
    return out


def test_augmented_batches_identical_across_runs_and_workers(images: Path) -> None:
    ref = _epoch(images, 1)
    for kw in ({"num_workers": 2}, {"num_workers": 1}, {}):
        got = _epoch(images, 1, **kw)
        assert all(torch.equal(a["jpg"], b["jpg"]) and torch.equal(a["label"], b["label"])
                   for a, b in zip(ref, got, strict=True))
    assert ref[0]["jpg"].shape == (8, 16, 16, 3) and ref[0]["jpg"].dtype == torch.uint8


def test_augmentation_depends_on_epoch_and_sample_not_position(images: Path) -> None:
    def by_label(batches: list[dict[str, torch.Tensor]]) -> dict[int, torch.Tensor]:
        return {int(l): b["jpg"][i] for b in batches for i, l in enumerate(b["label"])}

    e1, e2 = by_label(_epoch(images, 1)), by_label(_epoch(images, 2))
    assert sorted(e1) == list(range(N))
    assert sum(not torch.equal(e1[i], e2[i]) for i in range(N)) > N // 2
    src = ArrowSource(Manifest.load(images), image=AUG)
    for ids in (np.array([3, 17, 30]), np.array([30, 3])):  # any batch, any position
        b = src.fetch(ids, epoch=1, seed=5)
        for i, s in enumerate(ids):
            assert torch.equal(b["jpg"][i], e1[int(s)])


def test_fast_and_pyarrow_paths_agree(images: Path) -> None:
    m = Manifest.load(images)
    opts = ImageOptions("jpg", size=(12, 10), crop=(0.5, 1.0), flip=True, output="float32",
                        normalize=((0.5, 0.4, 0.3), (0.2, 0.25, 0.3)))
    ids = np.array([5, 39, 0, 22])
    a = ArrowSource(m, image=opts).fetch(ids, 3, 9)
    b = ArrowSource(m, image=opts, fast=False).fetch(ids, 3, 9)
    assert a["jpg"].dtype == torch.float32 and torch.equal(a["jpg"], b["jpg"])


def test_identity_decode_equals_pillow_pixels(images: Path) -> None:
    src = ArrowSource(Manifest.load(images), image=ImageOptions("jpg", size=(20, 24)))
    batch = src.fetch(np.array([7, 1]))
    for i, s in enumerate((7, 1)):
        ref = np.asarray(Image.open(io.BytesIO(_jpeg(s, 20))).convert("RGB"))
        # libjpeg-turbo vs Pillow's libjpeg: same IDCT family, allow one level of rounding
        assert np.abs(batch["jpg"][i].numpy().astype(int) - ref).max() <= 2


@pytest.mark.parametrize("size", [(16, 16), (32, 40), (20, 24)])
def test_identity_decode_of_other_sizes_equals_the_pyarrow_path(images: Path, size) -> None:
    # images are 20 x 24: smaller and larger outputs are resampled, not decoded in place
    # (a larger image does not fit the output; a smaller one fills only part of it)
    m, ids = Manifest.load(images), np.array([3, 38, 17, 0])
    opts = ImageOptions("jpg", size=size)
    a = ArrowSource(m, image=opts).fetch(ids)
    b = ArrowSource(m, image=opts, fast=False).fetch(ids)
    assert a["jpg"].shape == (4, *size, 3) and torch.equal(a["jpg"], b["jpg"])


@pytest.mark.parametrize("kw,match", [
    ({"size": (0, 4)}, "size"), ({"crop": (0.5, 0.2)}, "crop"), ({"output": "int8"}, "output"),
    ({"normalize": ((0, 0, 0), (1, 1, 1))}, "normalize needs output='float32'"),
])
def test_options_are_validated(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ImageOptions("jpg", **kw)  # type: ignore[arg-type]


def test_image_column_must_be_binary(images: Path) -> None:
    with pytest.raises(ValueError, match="'label' is int64; it must be a binary column"):
        DataLoader(images, batch_size=4,
                   read=ReadOptions(image=ImageOptions("label", size=(8, 8))))


def test_png_goes_through_pillow(tmp_path: Path) -> None:
    from fastpath_helpers import write_dataset

    rng = np.random.default_rng(3)
    pixels = [rng.integers(0, 256, (6, 5, 3), dtype=np.uint8) for _ in range(3)]
    blobs = []
    for p in pixels:
        buf = io.BytesIO()
        Image.fromarray(p).save(buf, "PNG")
        blobs.append(buf.getvalue())
    write_dataset(tmp_path, [pa.table({"png": pa.array(blobs, pa.binary())})])
    batch = ArrowSource(Manifest.load(tmp_path), image=ImageOptions("png", size=(6, 5))).fetch(
        np.array([2, 0]))
    assert np.array_equal(batch["png"].numpy(), np.stack([pixels[2], pixels[0]]))  # lossless


NUMBA_FREE = """
import hashlib, sys
from stoker.loader import DataLoader, ReadOptions
from stoker.loader.fastpath.images import ImageOptions
dl = DataLoader(sys.argv[1], batch_size=8, shuffle=True, seed=5, num_workers=int(sys.argv[2]),
                read=ReadOptions(image=ImageOptions("jpg", size=(20, 24))))
h = hashlib.sha256()
for b in dl:
    h.update(b["jpg"].numpy().tobytes() + b["label"].numpy().tobytes())
print(h.hexdigest(), "numba" in sys.modules, dl._source.numba_free, dict(dl.stats.fallbacks))
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_images_without_augmentation_never_import_numba(images: Path, tmp_path: Path,
                                                         workers: int) -> None:
    """An image plan without augmentation reads every batch with the NumPy twins and the
    order's twin (stoker.loader.read.arrow.ArrowSource.numba_free): the process never imports
    Numba, and the batches are the kernels' (``STOKER_COLD_START=wait`` keeps the kernels)."""
    import os
    import subprocess
    import sys

    script = tmp_path / "run.py"
    script.write_text(NUMBA_FREE)

    def run(**env: str) -> list[str]:
        base = {k: v for k, v in os.environ.items() if k != "STOKER_COLD_START"}
        out = subprocess.run([sys.executable, str(script), str(images), str(workers)],
                             capture_output=True, text=True, timeout=300, env={**base, **env})
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout.split()

    free, kernels = run(), run(STOKER_COLD_START="wait")
    assert free[1:] == ["False", "True", "{}"]  # no Numba, no fallback counted
    assert kernels[1:3] == ["True", "False"]
    assert free[0] == kernels[0]
