"""``stoker shard SRC... DST``: convert any supported source into a deterministic stoker dataset."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("shard", help="convert a dataset into deterministic Arrow IPC shards",
                       usage="stoker shard SRC [SRC ...] DST [options]",
                       description="Convert Parquet (file, directory, glob, hive partitions), CSV "
                       "or JSONL (.zst too), WebDataset tars (.tar/.tgz/.tar.zst), an image-folder "
                       "tree (ROOT/<class>/<image>), a Hugging Face save_to_disk directory or "
                       "token files (.npy/.bin) into Arrow IPC shards plus manifest.json. The "
                       "output is byte-identical for any --workers or --engine; an interrupted "
                       "run resumes.")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="one or more sources (files, directories, quoted globs), then DST; "
                   "put options after DST")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--shard-size", metavar="SIZE",
                      help="uncompressed bytes per shard, e.g. 256MB or 64MiB (default 256MB)")
    size.add_argument("--rows-per-shard", type=int, metavar="N", help="exact rows per shard")
    p.add_argument("--compression", choices=("none", "zstd"), default="none",
                   help="Arrow IPC buffer compression of the shards (default none)")
    p.add_argument("--columns", metavar="A,B", help="comma-separated columns to keep, in order")
    p.add_argument("--workers", type=int, metavar="N",
                   help="processes writing shards (default 1; with --scheduler: the cluster's "
                   "workers)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing dataset or non-empty directory at DST")
    p.add_argument("--format", choices=("parquet", "csv", "jsonl", "webdataset", "imagefolder",
                                        "hf", "tokens"),
                   help="input format (default: detected from file extensions; a directory of "
                   "class folders is imagefolder, a save_to_disk directory is hf)")
    p.add_argument("--token-dtype", choices=("uint16", "uint32"),
                   help="token files: element type (required for raw .bin)")
    p.add_argument("--seq-len", type=int, metavar="N",
                   help="token files: tokens per sequence (the tail of each file is dropped "
                   "and recorded)")
    p.add_argument("--on-bad", choices=("error", "skip"), default="error",
                   help="image folders: stop at an unreadable image or non-image file "
                   "(default), or leave it out and list it in the manifest")
    p.add_argument("--engine", choices=("local", "dask"), default="local",
                   help="local process pool (default) or Dask distributed (pip install "
                   "'stoker[dask]'); the output bytes are the same")
    p.add_argument("--scheduler", metavar="ADDR",
                   help="with --engine dask: a running scheduler, e.g. tcp://10.0.0.5:8786 "
                   "(DST must be on storage every worker sees); default: a local cluster of "
                   "--workers processes")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no summary")
    return p


def run(args: argparse.Namespace) -> int:
    from stoker.sharder import ShardOptionsError, format_size, shard
    from stoker.tools.cli import UsageError

    if len(args.paths) < 2:
        raise UsageError("give at least one SRC and a DST, e.g. `stoker shard data/ out/`.")
    *sources, dst = args.paths
    columns = None
    if args.columns is not None:
        columns = [c.strip() for c in args.columns.split(",") if c.strip()]
    if args.scheduler is not None and args.engine != "dask":
        raise UsageError("--scheduler needs --engine dask.")
    start = time.perf_counter()
    try:
        executor = None
        if args.engine == "dask":
            from stoker.sharder.executor_dask import DaskExecutor

            executor = DaskExecutor(args.scheduler, args.workers)
        workers = 1 if args.workers is None else args.workers
        manifest = shard(sources, dst, rows_per_shard=args.rows_per_shard,
                         shard_size=args.shard_size, compression=args.compression,
                         columns=columns, workers=workers, overwrite=args.overwrite,
                         format=args.format, progress=False if args.quiet else None,
                         executor=executor, token_dtype=args.token_dtype, seq_len=args.seq_len,
                         on_bad=args.on_bad)
    except ShardOptionsError as exc:
        raise UsageError(str(exc)) from exc
    if not args.quiet:
        took = time.perf_counter() - start
        size = int(manifest.shard_bytes.sum())
        print(f"{dst}: {manifest.num_samples:,} rows in {manifest.num_shards} shards, "
              f"{format_size(size)} ({manifest.compression}), {took:.1f} s, "
              f"fingerprint {manifest.fingerprint}", file=sys.stderr)
    return 0
