"""CUDA feed: pinned ring buffers and side-stream copies (skipped without CUDA)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from stoker.loader import DataLoader
from stoker.loader.read.arrow import ArrowSource
from stoker.manifest import Manifest

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

KW = {"batch_size": 16, "shuffle": True, "seed": 4, "features": ["f0", "f1"],
      "categoricals": ["c0"], "columns": ["id", "seq"]}


def test_cuda_batches_equal_cpu_batches(mixed_dataset: Path) -> None:
    cpu = [{k: v.clone() for k, v in b.items()} for b in DataLoader(mixed_dataset, **KW)]
    gpu = DataLoader(mixed_dataset, device="cuda", num_workers=2, prefetch_factor=2, **KW)
    seen = 0
    for a, b in zip(cpu, gpu, strict=True):
        for k in a:
            assert b[k].is_cuda
            torch.testing.assert_close(b[k].cpu(), a[k], equal_nan=True, rtol=0, atol=0)
        seen += 1
        torch.cuda._sleep(1_000_000)  # keep the GPU busy so later copies really overlap
    assert seen == len(cpu)


def test_fast_path_buffers_are_pinned_and_reused(mixed_dataset: Path) -> None:
    src = ArrowSource(Manifest.load(mixed_dataset), features=["f0"], pin=True)
    rng = np.random.default_rng(0)
    batch = src.fetch(rng.permutation(111)[:8])
    assert batch["features"].is_pinned()
    for _ in range(10):
        batch = src.fetch(rng.permutation(111)[:8])
    assert src.ring.allocations <= 2


def test_pin_memory_returns_pinned_tensors(mixed_dataset: Path) -> None:
    for b in DataLoader(mixed_dataset, pin_memory=True, **KW):
        assert all(v.is_pinned() for v in b.values())
