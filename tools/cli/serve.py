"""``stoker serve DATASET...``: serve batches to trainers over Arrow Flight (stoker.serve).

    stoker serve DATASET [DATASET...] --host H --port P [--workers N] [--token-file F]
                 [--transform module:function]
    stoker serve --status URL [--token-file F]
    stoker serve --dask SCHEDULER DATASET [DATASET...]
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("serve", help="serve batches to trainers (Arrow Flight)",
                       description="Serve the batches of the named stoker datasets to "
                       "DataLoader(..., workers=WorkerOptions(service=[URL, ...])). Prints each "
                       "server's URL on stdout; SIGTERM stops gracefully.")
    p.add_argument("datasets", metavar="DATASET", nargs="*", help="dataset paths or URLs")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default "
                   "127.0.0.1; 0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, default=0, help="port (default 0: a free one)")
    p.add_argument("--workers", type=int, default=1,
                   help="server processes (ports P, P+1, ...; default 1)")
    p.add_argument("--token-file", help="refuse clients that do not send this file's token")
    p.add_argument("--transform", action="append", default=[], metavar="MODULE:FUNCTION",
                   help="a batch transform clients may ask for by name (repeatable)")
    p.add_argument("--cache-dir", help="shard cache for remote datasets")
    p.add_argument("--cache-limit", help="shard cache budget, e.g. 20GiB")
    p.add_argument("--status", metavar="URL", help="print a server's health and counters")
    p.add_argument("--dask", metavar="SCHEDULER",
                   help="start one server per worker of this running Dask cluster")
    return p


def run(args: argparse.Namespace) -> int:
    from stoker.tools.cli import UsageError

    if args.status:
        from stoker.serve.auth import read_token
        from stoker.serve.run import fetch_status

        token = read_token(args.token_file) if args.token_file else None
        print(json.dumps(fetch_status(args.status, token), indent=2))
        return 0
    if not args.datasets:
        raise UsageError("name at least one DATASET to serve (or --status URL).")
    if args.workers < 1:
        raise UsageError(f"--workers {args.workers}: must be >= 1.")
    from stoker.serve.run import ServeOptions, serve_forever, serve_workers

    options = ServeOptions(list(args.datasets), args.host, args.port, args.workers,
                           args.token_file, list(args.transform), args.cache_dir,
                           args.cache_limit)
    if args.dask:
        from stoker.serve.dask_launch import serve_on_dask

        return serve_on_dask(args.dask, options)
    if args.workers > 1:
        return serve_workers(options)
    return serve_forever(options)
