"""``stoker index SRC [DST]``: a manifest over existing Parquet files or tars, read in place."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("index", help="index existing Parquet files or tars without rewriting them",
                       description="Write DST/manifest.json over the Parquet files (row-group "
                       "granular) or uncompressed WebDataset tars (per-sample byte offsets) under "
                       "SRC. The files stay where they are and must lie inside DST (default: "
                       "SRC). The loader checks each file's size and xxh3-128 before reading it.")
    p.add_argument("src", metavar="SRC", help="a directory of Parquet files or .tar files")
    p.add_argument("dst", metavar="DST", nargs="?",
                   help="dataset directory holding the manifest (default SRC); must contain SRC")
    p.add_argument("--format", choices=("parquet", "webdataset"),
                   help="what to index (default: detected)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="processes hashing files (default 1)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing manifest.json")
    p.add_argument("--quiet", action="store_true", help="no summary")
    return p


def run(args: argparse.Namespace) -> int:
    from stoker.sharder import ShardOptionsError
    from stoker.sharder.index import index
    from stoker.tools.cli import UsageError

    try:
        manifest = index(args.src, args.dst, format=args.format, overwrite=args.overwrite,
                         workers=args.workers)
    except ShardOptionsError as exc:
        raise UsageError(str(exc)) from exc
    if not args.quiet:
        print(f"{manifest.root}: {manifest.kind}, {manifest.num_samples:,} samples in "
              f"{manifest.num_shards} files, fingerprint {manifest.fingerprint}", file=sys.stderr)
    return 0
