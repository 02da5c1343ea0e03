"""Worker modes for generic (map-style torch) datasets: threads vs processes vs torch.

``.venv/bin/python bench/worker_mode_bench.py [--repeats 3] [--samples 2048]`` prints a table
of samples/s (median over repeats; cases interleaved in every repeat, so machine load hits
them alike) for three datasets typical of the generic path:

* ``augment``: a 3x64x64 uint8 image held in memory, random 56x56 crop and flip (numpy),
  to float, normalised (torch): Python-level work that holds the GIL most of the time.
* ``decode``: a 64x64 JPEG decoded with PIL, random crop and flip (PIL), to a tensor: the
  decode releases the GIL.
* ``light``: ``torch.tensor([i])``: what a loader costs per batch when the dataset is free.

Cases: stoker with 0 workers, 2 threads, 2 processes; torch's DataLoader with 2 worker
processes. Each epoch builds a new loader (workers start inside the timing, as for a
non-persistent torch loader). This decides stoker's default worker mode for generic datasets.
"""

from __future__ import annotations

import argparse
import io
import random
import statistics
import time
from typing import Any, Callable

import numpy as np
import torch

from stoker.loader import DataLoader, WorkerOptions

BATCH = 64


class Augment(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.images = np.random.default_rng(0).integers(0, 255, (n, 3, 64, 64), dtype=np.uint8)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> torch.Tensor:
        y, x = np.random.randint(0, 9, size=2)
        crop = self.images[i, :, y:y + 56, x:x + 56]
        if random.random() < 0.5:
            crop = crop[:, :, ::-1]
        t = torch.from_numpy(np.ascontiguousarray(crop)).float().div_(255)
        return (t - 0.5) / 0.25


class Decode(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        from PIL import Image

        rng = np.random.default_rng(0)
        self.blobs = []
        for _ in range(min(n, 256)):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(
                buf, format="JPEG", quality=90)
            self.blobs.append(buf.getvalue())
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        from PIL import Image

        img = Image.open(io.BytesIO(self.blobs[i % len(self.blobs)])).convert("RGB")
        x, y = random.randint(0, 8), random.randint(0, 8)
        img = img.crop((x, y, x + 56, y + 56))
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.asarray(img)).permute(2, 0, 1).float()


class Light(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i])


CASES: dict[str, Callable[[Any], Any]] = {
    "stoker, 0 workers": lambda ds: DataLoader(ds, batch_size=BATCH, seed=0),
    "stoker, 2 threads": lambda ds: DataLoader(ds, batch_size=BATCH, seed=0, num_workers=2,
                                               workers=WorkerOptions(mode="thread")),
    "stoker, 2 processes": lambda ds: DataLoader(ds, batch_size=BATCH, seed=0, num_workers=2,
                                                 workers=WorkerOptions(mode="process")),
    "torch, 2 processes [baseline]": lambda ds: torch.utils.data.DataLoader(
        ds, batch_size=BATCH, num_workers=2),
}


def _epoch(make: Callable[[Any], Any], ds: Any) -> float:
    t0 = time.perf_counter()
    loader = make(ds)
    n = sum(len(b) for b in loader)
    dt = time.perf_counter() - t0
    if hasattr(loader, "close"):
        loader.close()
    return n / dt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--samples", type=int, default=2048)
    args = ap.parse_args(argv)
    datasets = {"augment": Augment(args.samples), "decode": Decode(args.samples),
                "light": Light(args.samples * 4)}
    print(f"| dataset | {' | '.join(CASES)} |")
    print("|---|" + "---:|" * len(CASES))
    for name, ds in datasets.items():
        runs: dict[str, list[float]] = {c: [] for c in CASES}
        for _ in range(args.repeats):
            for case, make in CASES.items():
                runs[case].append(_epoch(make, ds))
        base = statistics.median(runs["torch, 2 processes [baseline]"])
        cells = [f"{statistics.median(v):,.0f} ({statistics.median(v) / base:.2f}x)"
                 for v in runs.values()]
        print(f"| {name} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
