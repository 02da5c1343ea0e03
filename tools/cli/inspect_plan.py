"""``stoker inspect DST --plan``: the order a DataLoader would use and what one rank holds live.

Builds the loader the options describe (no shard is read beyond one record batch, which fixes
the record stride) and prints its resolved order options and working set
(:mod:`stoker.loader.order.working_set`): the most shards, shard bytes, staged rows and staging
bytes one rank needs at once, and whether shuffled batches come from per-shard records (they
fit the records budget) or from staged rounds. Options that cannot fit this node are the
loader's own :class:`~stoker.loader.read.order_plan.WorkingSetError` (exit 1), naming options
that fit.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["add_plan_arguments", "plan_info", "print_plan"]


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("--plan: the loader's order and working set")
    g.add_argument("--plan", action="store_true",
                   help="print the order options and working set of a DataLoader over DST")
    g.add_argument("--batch-size", type=int, default=256, help="per-rank batch size (256)")
    g.add_argument("--world-size", type=int, default=1, help="ranks (1)")
    g.add_argument("--num-workers", type=int, default=0, help="workers per rank (0)")
    g.add_argument("--worker-mode", choices=("thread", "process"), default="thread")
    g.add_argument("--partitions", type=int, default=None, help="ShuffleOptions(partitions=)")
    g.add_argument("--block-size", type=int, default=0, help="ShuffleOptions(block_size=)")
    g.add_argument("--columns", default=None, help="comma-separated columns (default: all)")
    g.add_argument("--no-shuffle", action="store_true", help="natural order")


def plan_info(args: argparse.Namespace) -> dict[str, Any]:
    """The plan ``--plan`` prints, as a JSON-able dict."""
    from stoker.loader import DataLoader, ShuffleOptions, WorkerOptions
    from stoker.manifest import StokerError
    from stoker.tools.cli.entry import UsageError

    columns = args.columns.split(",") if args.columns else None
    try:
        shuffle: Any = False if args.no_shuffle else ShuffleOptions(
            partitions=args.partitions, block_size=args.block_size)
        loader = DataLoader(args.dataset, batch_size=args.batch_size, shuffle=shuffle,
                            num_workers=args.num_workers,
                            workers=WorkerOptions(mode=args.worker_mode),
                            world_size=args.world_size, rank=0, columns=columns)
    except StokerError:  # the dataset, or options this node cannot hold: exit 1
        raise
    except ValueError as exc:  # options that contradict each other: bad usage, exit 2
        raise UsageError(str(exc)) from None
    try:
        ws = loader.working_set
        readers = getattr(loader._source, "readers", [loader._source])
        over = [r.records_over_budget() for r in readers if hasattr(r, "records_over_budget")]
        over = [o for o in over if o is not None]
        return {"dataset": args.dataset, "batch_size": args.batch_size,
                "world_size": args.world_size, "num_workers": args.num_workers,
                "worker_mode": args.worker_mode, "order": loader.order_options.to_dict(),
                "steps_per_epoch": len(loader),
                "working_set": None if ws is None else ws.to_dict(),
                "shuffled_reads": None if args.no_shuffle else
                ("staged rounds" if over else "per-shard records"),
                "records_bytes": over[0][0] if over else None,
                "records_budget": over[0][1] if over else None}
    finally:
        loader.close()


def print_plan(args: argparse.Namespace) -> int:
    from stoker.sharder import format_size

    info = plan_info(args)
    if args.json:
        print(json.dumps(info, indent=1, sort_keys=True))
        return 0
    order, ws = info["order"], info["working_set"]
    lines = [f"dataset      {info['dataset']}",
             f"loader       batch {info['batch_size']} per rank, world size "
             f"{info['world_size']}, {info['num_workers']} {info['worker_mode']} workers, "
             f"{info['steps_per_epoch']:,} steps per epoch",
             f"order        {json.dumps(order, sort_keys=True)}"]
    if ws is not None:
        lines += [f"working set  {ws['shards']:,} shards live ({format_size(ws['shard_bytes'])} "
                  f"with the ones fetched ahead), {ws['staged_rows']:,} rows staged "
                  f"({format_size(ws['staging_bytes'])})"]
    if info["shuffled_reads"] is not None:
        extra = "" if info["records_bytes"] is None else \
            (f" (records {format_size(info['records_bytes'])} > budget "
             f"{format_size(info['records_budget'])})")
        lines.append(f"shuffled     batches from {info['shuffled_reads']}{extra}")
    print("\n".join(lines))
    return 0
