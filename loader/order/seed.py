"""The 64-bit key of every random draw of the order (:func:`derive_seed`).

One function keys every draw (shard permutation, block keys, piece order, and the image
augmentations of :mod:`stoker.loader.fastpath.images`), so randomness is a pure function of
its inputs, named in one place, and versioned by :data:`ORDER_ALGORITHM`.
"""

from __future__ import annotations

import xxhash

from stoker.loader.order.options import ORDER_ALGORITHM, OrderError, check_int
from stoker.manifest import canonical_json

__all__ = ["derive_seed"]


def derive_seed(fingerprint: str, seed: int, epoch: int, *salt: int) -> int:
    """64-bit key for one random draw: xxh3_64 of the canonical JSON of all inputs.

    Every random choice of the order is keyed through here, so it depends on nothing but
    these values (and the algorithm name, which is hashed too).
    """
    if not isinstance(fingerprint, str):
        raise OrderError(f"fingerprint must be a str, got {type(fingerprint).__name__}.")
    ints = [check_int("seed", seed), check_int("epoch", epoch)]
    ints += [check_int("salt", s) for s in salt]
    return xxhash.xxh3_64_intdigest(canonical_json([ORDER_ALGORITHM, fingerprint, *ints]))

