"""``stoker export DST --to webdataset|parquet OUT``: write a dataset out for other tools."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("export", help="export a dataset to WebDataset tars or Parquet files",
                       description="Write one WebDataset tar or Parquet file per shard of DST "
                       "into OUT, rows in dataset order (see stoker.tools.export for the rules).")
    p.add_argument("dataset", metavar="DST", help="a stoker dataset (holds manifest.json)")
    p.add_argument("--to", required=True, choices=("webdataset", "parquet"), help="output format")
    p.add_argument("out", metavar="OUT", help="output directory (new or empty)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT's contents")
    p.add_argument("--quiet", action="store_true", help="no summary")
    return p


def run(args: argparse.Namespace) -> int:
    from stoker.tools.cli import UsageError
    from stoker.tools.export import ExportError, export

    try:
        files = export(args.dataset, args.out, to=args.to, overwrite=args.overwrite)
    except ExportError as exc:
        if "not empty" in str(exc) or "not supported" in str(exc):
            raise UsageError(str(exc)) from exc
        raise
    if not args.quiet:
        print(f"{args.out}: {len(files)} {args.to} files", file=sys.stderr)
    return 0
