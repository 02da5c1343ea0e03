"""Random state for the user's code: a pure function of (seed, epoch, what the call reads).

Every call of a user dataset's ``__getitem__`` (or ``__getitems__``) runs with torch's,
numpy's and ``random``'s global generators seeded from ``(seed, epoch, sample index)``, and
batch-level user code (``collate_fn``, ``transform``) from ``(seed, epoch, batch ids)``. An
augmentation therefore draws the same values on every run, whatever ``num_workers``, worker
mode, world size or resume point: torch's DataLoader seeds per *worker*, so its values change
with ``num_workers``. ``sample_seeding=False`` turns this off (torch's per-worker seeding only).

Only the CPU generators are seeded: ``torch.manual_seed`` would also seed every accelerator
(~170 us a call on a CPU-only build, ~1.5 us for the CPU generator alone).
"""

from __future__ import annotations

import random
import struct
from typing import Any

import numpy as np
import torch
import xxhash

__all__ = ["RngState", "batch_seed", "sample_seed", "seed_all"]

_SAMPLE, _BATCH = 1, 2  # domain tags: a sample's seed never equals a batch's


def sample_seed(seed: int, epoch: int, index: Any) -> int:
    """64-bit seed of one ``dataset[index]`` call; ``index`` is an int, or a list of ints when a
    sampler hands whole index lists to ``__getitem__`` (``batch_size=None``)."""
    if isinstance(index, (int, np.integer)):
        return xxhash.xxh3_64_intdigest(struct.pack("<qqqq", _SAMPLE, seed, epoch, int(index)))
    return batch_seed(seed, epoch, index)


def batch_seed(seed: int, epoch: int, ids: Any) -> int:
    """64-bit seed of a call on several samples (``__getitems__``, ``collate_fn``, ``transform``)."""
    flat = np.asarray(ids, dtype=np.int64).ravel()
    return xxhash.xxh3_64_intdigest(struct.pack("<qqq", _BATCH, seed, epoch) + flat.tobytes())


def seed_all(seed: int) -> None:
    """Seed torch's CPU generator, numpy's global ``RandomState`` and ``random`` from ``seed``.

    numpy's legacy seeding takes 32 bits (seeding with an array costs ~8x more); torch and
    ``random`` take all 64.
    """
    torch.default_generator.manual_seed(seed)
    np.random.seed((seed ^ (seed >> 32)) & 0xFFFFFFFF)
    random.seed(seed)


class RngState:
    """The global generators' state, saved so it can be put back.

    User code in the main process or in a thread worker shares the generators with the
    training loop; their state is restored after each batch so the loader leaves no trace in
    the caller's random stream.
    """

    __slots__ = ("_numpy", "_random", "_torch")

    def __init__(self) -> None:
        self._torch = torch.default_generator.get_state()
        self._numpy = np.random.get_state()
        self._random = random.getstate()

    def restore(self) -> None:
        torch.default_generator.set_state(self._torch)
        np.random.set_state(self._numpy)
        random.setstate(self._random)
