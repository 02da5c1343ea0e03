"""``stoker inspect path/to/mixture.json``: the mixture's sources, sizes, weights and schedule.

Reads the sources' manifests (no shard): each source's samples, shards and bytes as
``stoker inspect`` gives them for one dataset, the exact weights of every schedule segment
with their shares, and the samples per loader epoch.
"""

from __future__ import annotations

import json
from typing import Any

from stoker.tools.cli.inspect import summarize

__all__ = ["describe_mixture", "print_mixture"]


def describe_mixture(mixture: Any) -> dict[str, Any]:
    """The facts ``inspect`` prints for a mixture, as a JSON-able dict."""
    out = mixture.describe()
    out["samples_per_epoch"] = mixture.num_samples
    out["exact_weights"] = mixture.blend.exact
    out["schedule"] = [{"position": start, "weights": {n: str(w) for n, w in ws.items()},
                        "shares": {n: float(w) for n, w in ws.items()}}
                       for start, ws in mixture.schedule]
    out["sources"] = [{**s, **{k: summarize(m)[k] for k in ("shards", "bytes", "compression")}}
                      for s, m in zip(out["sources"], mixture.manifests)]
    return out


def print_mixture(path: str, as_json: bool) -> int:
    from stoker.loader.order.mixture import Mixture
    from stoker.sharder import format_size

    info = describe_mixture(Mixture.load(path))
    if as_json:
        print(json.dumps(info, indent=1, sort_keys=True))
        return 0
    lines = [f"mixture      {path}", f"fingerprint  {info['fingerprint']}",
             f"epoch        {info['samples_per_epoch']:,} samples (the sources' sum)",
             f"weights      {'exact' if info['exact_weights'] else 'rounded to 2**-61'}",
             f"sources      {len(info['sources'])}"]
    for s in info["sources"]:
        lines.append(f"  {s['name']}: {s['samples']:,} samples, {s['shards']:,} shards, "
                     f"{format_size(s['bytes'])} ({s['compression']}), {s['dataset']}")
    for seg in info["schedule"]:
        shares = ", ".join(f"{n} {v:.4f}" for n, v in seg["shares"].items())
        lines.append(f"from {seg['position']:>12,}  {shares}")
    print("\n".join(lines))
    return 0
