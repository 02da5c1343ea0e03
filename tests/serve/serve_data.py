"""Datasets of the data-service tests: W1-shaped rows and JPEG images, a few shards."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
from PIL import Image

from shard_writer import write_dataset

from stoker.loader.options import ReadOptions

__all__ = ["W1_KW", "image_dataset", "image_kw", "w1_dataset"]

FEATURES = [f"f{j}" for j in range(64)]
CATS = [f"c{j}" for j in range(8)]
W1_KW = {"read": ReadOptions(features=FEATURES, categoricals=CATS), "columns": ["emb", "label"]}


def _w1_table(lo: int, n: int) -> pa.Table:
    rng = np.random.default_rng(lo)
    cols: dict[str, pa.Array] = {f: pa.array(rng.standard_normal(n).astype(np.float32))
                                 for f in FEATURES}
    cols.update({c: pa.array(rng.integers(0, 1000, n)) for c in CATS})
    emb = rng.standard_normal((n, 16)).astype(np.float32)
    cols["emb"] = pa.FixedSizeListArray.from_arrays(pa.array(emb.ravel()), 16)
    cols["label"] = pa.array(np.arange(lo, lo + n, dtype=np.int64))
    return pa.table(cols)


def w1_dataset(root: Path, shards: tuple[int, ...] = (300, 250, 310, 200)) -> Path:
    """W1-shaped rows (64 float32, 8 int64, fixed list<float32>[16], label) in shards."""
    starts = np.concatenate([[0], np.cumsum(shards)])
    write_dataset(root, [_w1_table(int(lo), n) for lo, n in zip(starts, shards)],
                  batch_rows=64)
    return root


def _jpeg(i: int) -> bytes:
    img = np.random.default_rng(i).integers(0, 256, (20, 24, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def image_dataset(root: Path, shards: tuple[int, ...] = (30, 26, 24)) -> Path:
    """JPEGs (20x24 RGB) with a label, in shards."""
    starts = np.concatenate([[0], np.cumsum(shards)])
    write_dataset(root, [pa.table({"jpg": pa.array([_jpeg(i) for i in range(lo, lo + n)],
                                                   pa.binary()),
                                   "label": pa.array(np.arange(lo, lo + n))})
                         for lo, n in zip(starts, shards)])
    return root


def image_kw() -> dict:
    from stoker.loader.fastpath.images import ImageOptions

    return {"read": ReadOptions(image=ImageOptions("jpg", size=(16, 16), crop=(0.3, 1.0),
                                                   flip=True))}
