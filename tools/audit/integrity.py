"""Shard integrity: re-hash the run's dataset against its manifest when it is local."""

from __future__ import annotations

from stoker.manifest import hash_file, is_url
from stoker.tools.audit.replay import DatasetView
from stoker.tools.audit.report import Check

__all__ = ["integrity_check"]


def integrity_check(view: DatasetView, enabled: bool = True) -> Check:
    """Size and xxh3-128 of every shard against the manifest (skipped for remote datasets)."""
    m = view.manifest
    if not enabled:
        return Check("integrity", "skip", "shard verification disabled (--no-verify)")
    if m is None:
        return Check("integrity", "skip", view.problem or "no manifest (generic dataset)")
    if m.root is None or (is_url(m.root) and not m.root.startswith("file://")):
        return Check("integrity", "skip", f"dataset {view.location} is remote; verify it with "
                     "`stoker verify` where it lives", {"dataset": view.location})
    bad = []
    for i, shard in enumerate(m.shards):
        path = m.shard_location(i).removeprefix("file://")
        try:
            digest, size = hash_file(path)
        except OSError as exc:
            bad.append({"shard": shard.path, "problem": f"unreadable ({exc.strerror or exc})"})
            continue
        if size != shard.bytes or digest != shard.xxh3_128:
            bad.append({"shard": shard.path, "problem": f"bytes {size} xxh3 {digest}, manifest "
                        f"says bytes {shard.bytes} xxh3 {shard.xxh3_128}"})
    details = {"dataset": view.location, "shards": m.num_shards, "bad": bad[:100]}
    if bad:
        return Check("integrity", "fail", f"{len(bad)} of {m.num_shards} shards do not match the "
                     f"manifest; first: {bad[0]['shard']} {bad[0]['problem']}", details)
    note = " (dataset changed since the run)" if view.changed else ""
    return Check("integrity", "pass", f"all {m.num_shards} shards match the manifest{note}",
                 details)
