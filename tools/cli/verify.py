"""``stoker verify DST``: re-hash every shard and compare size and xxh3-128 with the manifest."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

__all__ = ["add_parser", "find_mismatches", "run"]


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("verify", help="re-hash every shard against the manifest",
                       description="Check that every shard exists with the size and xxh3-128 "
                       "the manifest lists. Prints each mismatch; exit 1 on any, 0 when clean.")
    p.add_argument("dataset", metavar="DST", help="dataset directory (holds manifest.json)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def find_mismatches(manifest: Any, progress: bool | None = None) -> list[str]:
    """One line per shard that is missing, has the wrong size, or the wrong hash."""
    from stoker.manifest import hash_file
    from stoker.sharder.progress import progress_bar

    problems = []
    bar = progress_bar(int(manifest.shard_bytes.sum()), "verify", "B", progress)
    try:
        for i, info in enumerate(manifest.shards):
            path = manifest.shard_location(i)
            try:
                size = os.stat(path).st_size
                digest = hash_file(path)[0] if size == info.bytes else None
            except OSError as exc:
                problems.append(f"{info.path}: missing or unreadable ({exc.strerror})")
                continue
            finally:
                bar.update(info.bytes)
            if size != info.bytes:
                problems.append(f"{info.path}: size {size} bytes, manifest says {info.bytes}")
            elif digest != info.xxh3_128:
                problems.append(f"{info.path}: xxh3-128 {digest}, manifest says {info.xxh3_128}")
    finally:
        bar.close()
    return problems


def run(args: argparse.Namespace) -> int:
    from stoker.manifest import Manifest

    manifest = Manifest.load(args.dataset)
    problems = find_mismatches(manifest, False if args.quiet else None)
    for line in problems:
        print(f"MISMATCH {line}", file=sys.stdout)
    if problems:
        print(f"stoker verify: {len(problems)} of {manifest.num_shards} shards do not match the "
              f"manifest of {args.dataset}; restore them or re-create the dataset with "
              "`stoker shard --overwrite`.",
              file=sys.stderr)
        return 1
    print(f"{args.dataset}: all {manifest.num_shards} shards match "
          f"(fingerprint {manifest.fingerprint})")
    return 0
