"""Builders of small, deterministic inputs for the source, Dask and index tests."""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Iterable

import numpy as np
import pyarrow as pa
import zstandard

from stoker.manifest import Manifest


def tar_bytes(samples: Iterable[tuple[str, dict[str, bytes]]]) -> bytes:
    """An uncompressed tar of ``(key, {ext: data})`` samples, members in the given order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for key, files in samples:
            for ext, data in files.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime = len(data), 0
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def sample(i: int) -> dict[str, bytes]:
    """Sample ``i``: a binary payload of varying size, a class and a caption."""
    rng = np.random.default_rng(i)
    return {"jpg": rng.bytes(int(rng.integers(10, 3000))), "cls": str(i % 7).encode(),
            "txt": f"caption {i} é".encode(), "json": json.dumps({"i": i}).encode()}


def write_tars(root: Path, counts: tuple[int, ...] = (13, 9, 20), compress: str = "none",
               long_keys: bool = False) -> list[Path]:
    """Tars of ``counts`` samples each; keys are unique across tars."""
    root.mkdir(parents=True, exist_ok=True)
    paths, start = [], 0
    for t, n in enumerate(counts):
        prefix = ("d" * 120 + "/") if long_keys else ""
        data = tar_bytes((f"{prefix}s{start + i:06d}", sample(start + i)) for i in range(n))
        suffix = {"none": ".tar", "gz": ".tgz", "zst": ".tar.zst"}[compress]
        if compress == "gz":
            data = gzip.compress(data, mtime=0)
        elif compress == "zst":
            data = zstandard.ZstdCompressor().compress(data)
        path = root / f"part-{t:03d}{suffix}"
        path.write_bytes(data)
        paths.append(path)
        start += n
    return paths


def expected_tar_rows(counts: tuple[int, ...] = (13, 9, 20)) -> list[dict]:
    rows = []
    for i in range(sum(counts)):
        s = sample(i)
        rows.append({"__key__": f"s{i:06d}", "cls": i % 7, "jpg": s["jpg"],
                     "json": s["json"].decode(), "txt": s["txt"].decode()})
    return rows


def png(width: int, height: int, seed: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def jpeg(width: int, height: int, seed: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=80)
    return buf.getvalue()


def write_image_folder(root: Path, per_class: dict[str, int] | None = None) -> dict[str, bytes]:
    """ROOT/<class>/...: mixed sizes and formats, one nested sub-folder; returns rel -> bytes."""
    per_class = per_class or {"dog": 5, "cat": 4, "bird": 6}
    files = {}
    seed = 0
    for cls, n in per_class.items():
        for i in range(n):
            seed += 1
            rel = f"{cls}/{'sub/' if i == 0 else ''}img{i:03d}.{'png' if i % 2 else 'jpg'}"
            data = png(8 + i, 5 + 2 * i, seed) if i % 2 else jpeg(16 + i, 12, seed)
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
            files[rel] = data
    return files


def hf_table(start: int, n: int) -> pa.Table:
    return pa.table({"text": [f"row {i}" for i in range(start, start + n)],
                     "label": pa.array(np.arange(start, start + n) % 3, pa.int64()),
                     "emb": pa.array([[float(i), float(-i)] for i in range(start, start + n)],
                                     pa.list_(pa.float32()))})


def write_hf(root: Path, parts: tuple[int, ...] = (40, 25)) -> pa.Table:
    """The layout ``Dataset.save_to_disk`` writes: Arrow streams + state.json +
    dataset_info.json (built by hand: the ``datasets`` package is not a test dependency)."""
    root.mkdir(parents=True, exist_ok=True)
    tables, files, start = [], [], 0
    for k, n in enumerate(parts):
        table = hf_table(start, n)
        meta = {b"huggingface": json.dumps({"info": {"features": {}}}).encode()}
        table = table.replace_schema_metadata(meta)
        name = f"data-{k:05d}-of-{len(parts):05d}.arrow"
        with pa.OSFile(str(root / name), "wb") as sink, \
                pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=16)
        files.append({"filename": name})
        tables.append(table)
        start += n
    (root / "state.json").write_text(json.dumps({
        "_data_files": files, "_fingerprint": "abc", "_format_columns": None,
        "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False,
        "_split": None}))
    (root / "dataset_info.json").write_text(json.dumps({"citation": "", "features": {}}))
    return pa.concat_tables(tables).replace_schema_metadata(None)


def read_dataset(dst: str | os.PathLike[str]) -> pa.Table:
    """Every native shard of ``dst``, concatenated in manifest order."""
    manifest = Manifest.load(dst)
    tables = [pa.ipc.open_file(pa.memory_map(manifest.shard_location(i))).read_all()
              for i in range(manifest.num_shards)]
    return pa.concat_tables(tables)


def dataset_bytes(dst: str | os.PathLike[str]) -> dict[str, bytes]:
    """Every file of a dataset directory (manifest included), by relative path."""
    root = Path(dst)
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}
