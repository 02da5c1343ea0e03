"""One manifest over all of a mixture's shards, so a batch is read by one reader call.

A mixture id is ``offset_i + id`` (see :mod:`stoker.loader.order.mixture_order`): exactly the
global id of the sample in the concatenation of the sources' shards in ``Mixture.names``
order. When every source is a local stoker dataset with the same schema and compression,
those shards form an ordinary dataset rooted at the sources' common directory: its manifest
lists every shard (same rows, bytes and xxh3-128, path relative to that directory), and a
reader over it serves a whole mixed batch in one call, as fast as a single dataset, instead of
one call per source and a merge (:mod:`stoker.loader.read.mixture`). Each shard is resolved
inside its own source first, so a link that leaves its source is refused as it would be there.
"""

from __future__ import annotations

import dataclasses
import os

from stoker.manifest import Manifest, ManifestError, is_url, resolve_inside, stoker_version

__all__ = ["union_manifest"]


def _local_root(manifest: Manifest) -> str | None:
    root = manifest.root
    if root is None or (is_url(root) and not root.startswith("file://")):
        return None
    return os.path.realpath(root.removeprefix("file://"))


def union_manifest(manifests: tuple[Manifest, ...]) -> Manifest | None:
    """The manifest of all ``manifests``' shards in order, or ``None`` when they cannot share
    one reader (a remote or index source, other schemas, other compression)."""
    first = manifests[0]
    roots = [_local_root(m) for m in manifests]
    if any(r is None for r in roots) or any(
            m.kind != "arrow" or m.compression != first.compression
            or not m.arrow_schema.equals(first.arrow_schema) for m in manifests):
        return None
    common = os.path.commonpath(roots)
    shards = []
    for m, root in zip(manifests, roots):
        for i, shard in enumerate(m.shards):
            real = resolve_inside(root, shard.path, f"shards[{i}].path")
            shards.append(dataclasses.replace(shard, path=os.path.relpath(real, common)))
    try:
        union = Manifest.create(schema=first.arrow_schema, shards=shards, sources=[],
                                options={"mixture_union": [m.fingerprint for m in manifests]},
                                stoker_version=stoker_version(), compression=first.compression)
    except ManifestError:  # a path the manifest format does not allow: read source by source
        return None
    return Manifest.from_dict(union.to_dict(), root=common)
