"""``stoker inspect DST``: what a dataset holds, from its manifest alone (no shard is read);
with ``--plan``, the order and working set a DataLoader over it would use."""

from __future__ import annotations

import argparse
import json
from typing import Any

from stoker.tools.cli.inspect_plan import add_plan_arguments

__all__ = ["add_parser", "run", "summarize"]


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("inspect", help="summarise a dataset (schema, counts, sizes)",
                       description="Print schema, samples, shards, bytes, compression ratio, "
                       "fingerprint and provenance of a stoker dataset.")
    p.add_argument("dataset", metavar="DST", help="dataset directory, manifest URL or mixture.json")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_plan_arguments(p)
    return p


def summarize(manifest: Any) -> dict[str, Any]:
    """The facts ``inspect`` prints, as a JSON-able dict.

    ``compression_ratio`` is uncompressed Arrow bytes (``extra.arrow_bytes`` of each shard,
    as written by ``stoker shard``) over bytes at rest; ``None`` when shards lack it.
    """
    at_rest = int(manifest.shard_bytes.sum())
    raw = [s.extra.get("arrow_bytes") for s in manifest.shards]
    arrow = sum(raw) if raw and all(isinstance(v, int) for v in raw) else None
    rows = manifest.shard_rows
    prov = manifest.provenance
    return {
        "dataset": manifest.root,
        "format": "stoker/1",
        "kind": manifest.kind,
        "fingerprint": manifest.fingerprint,
        "samples": manifest.num_samples,
        "shards": manifest.num_shards,
        "rows_per_shard": {"min": int(rows.min()) if len(rows) else 0,
                           "max": int(rows.max()) if len(rows) else 0},
        "bytes": at_rest,
        "arrow_bytes": arrow,
        "compression": manifest.compression,
        "compression_ratio": round(arrow / at_rest, 4) if arrow and at_rest else None,
        "schema": manifest.fields,
        "provenance": {"sources": len(prov["sources"]),
                       "source_bytes": sum(s["bytes"] for s in prov["sources"]),
                       "first_source": prov["sources"][0]["path"] if prov["sources"] else None,
                       "options": prov["options"], "stoker_version": prov["stoker_version"]},
    }


def run(args: argparse.Namespace) -> int:
    from stoker.manifest import Manifest
    from stoker.sharder import format_size

    from stoker.loader.order.mixture_file import is_mixture_file

    if args.plan:  # the loader's order and working set: stoker.tools.cli.inspect_plan
        from stoker.tools.cli.inspect_plan import print_plan

        return print_plan(args)
    if is_mixture_file(args.dataset):  # a mixture.json: stoker.tools.cli.inspect_mixture
        from stoker.tools.cli.inspect_mixture import print_mixture

        return print_mixture(args.dataset, args.json)
    info = summarize(Manifest.load(args.dataset))
    if args.json:
        print(json.dumps(info, indent=1, sort_keys=True))
        return 0
    ratio = info["compression_ratio"]
    prov = info["provenance"]
    lines = [
        f"dataset      {info['dataset']}",
        f"fingerprint  {info['fingerprint']}",
        f"samples      {info['samples']:,}",
        f"shards       {info['shards']:,} ({info['rows_per_shard']['min']:,}.."
        f"{info['rows_per_shard']['max']:,} rows each)",
        f"bytes        {format_size(info['bytes'])} at rest, compression {info['compression']}"
        + (f", ratio {ratio:.2f}x (Arrow {format_size(info['arrow_bytes'])})" if ratio else ""),
        f"provenance   {prov['sources']} source file(s), {format_size(prov['source_bytes'])}, "
        f"first {prov['first_source']!r}, stoker {prov['stoker_version']}",
        f"options      {json.dumps(prov['options'], sort_keys=True)}",
        f"schema       {len(info['schema'])} fields",
    ]
    lines += [f"  {f['name']}: {f['type']}{'' if f['nullable'] else ' not null'}"
              for f in info["schema"]]
    print("\n".join(lines))
    return 0
