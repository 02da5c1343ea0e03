"""Server-side transforms the tests name with ``--transform serve_transforms:...``."""

from __future__ import annotations

import time
from typing import Any

import torch

__all__ = ["jitter", "slow"]


def jitter(batch: dict[str, Any]) -> dict[str, Any]:
    """Adds seeded noise to ``features`` (the seed a loader sets for this batch)."""
    out = dict(batch)
    out["features"] = batch["features"] + torch.rand(batch["features"].shape)
    return out


def slow(batch: dict[str, Any]) -> dict[str, Any]:
    """Takes 1.5 s (a request in flight when SIGTERM arrives)."""
    time.sleep(1.5)
    return batch
