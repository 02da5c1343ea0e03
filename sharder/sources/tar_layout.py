"""Where each sample of an uncompressed WebDataset tar lies: byte spans and member offsets.

Found from the member headers alone (data is skipped, except the small text/integer members,
which are read once to check that they parse), grouped into samples with WebDataset's own
rules (``base_plus_ext``, ``__*__`` metadata skipped; replicated in
:mod:`stoker.manifest.webdataset_columns` because importing the ``webdataset`` package imports
torch, ~1 s in every sharding worker; a test checks the two agree).
``stoker index`` records the sample offsets; the tar source reads any sample range by these
offsets without re-parsing headers. Layouts are cached per process, keyed by path, size and
modification time.
"""

from __future__ import annotations

import os
import tarfile
import threading
from collections import OrderedDict
from dataclasses import dataclass

import pyarrow as pa

from stoker.manifest.webdataset_columns import base_plus_ext, is_meta
from stoker.sharder.errors import SharderError

__all__ = ["TarLayout", "base_plus_ext", "is_meta", "tar_layout"]

_CACHE: OrderedDict[tuple[str, int, int], "TarLayout"] = OrderedDict()
_CACHE_SIZE = 64
_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class TarLayout:
    """Samples of one tar.

    Attributes:
        offsets: N+1 byte offsets; sample ``i``'s members (headers included) are the bytes
            ``[offsets[i], offsets[i+1])``.
        exts: the extensions every sample has, sorted.
        keys: each sample's key.
        members: per sample, ``(ext, data offset, size)`` of each member, in tar order.
    """

    offsets: tuple[int, ...]
    exts: tuple[str, ...]
    keys: tuple[str, ...]
    members: tuple[tuple[tuple[str, int, int], ...], ...]


def tar_layout(path: str) -> TarLayout:
    """The layout of the uncompressed tar at ``path`` (cached while the file is unchanged).

    Raises:
        SharderError: a bad tar, a member without extension, a repeated key or file, samples
            with different extensions, a text/integer member that does not parse, no samples.
    """
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    with _lock:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    layout = _scan(path)
    with _lock:
        _CACHE[key] = layout
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return layout


def _scan(path: str) -> TarLayout:
    from stoker.sharder.sources.webdataset import check_exts, column_type, typed_value

    starts: list[int] = []
    keys: list[str] = []
    members: list[list[tuple[str, int, int]]] = []
    end = 0
    exts: list[str] | None = None
    seen: set[str] = set()

    def close() -> None:
        nonlocal exts
        if not members:
            return
        got = sorted(m[0] for m in members[-1])
        if exts is None:
            exts = got
        check_exts(path, {"__key__": keys[-1], **dict.fromkeys(got)}, exts)

    try:
        with tarfile.open(path, "r:") as tar:
            for member in tar:
                name = member.name
                if not member.isreg() or is_meta(name):
                    continue
                prefix, suffix = base_plus_ext(name)
                if prefix is None:
                    raise SharderError(f"{path!r}: member {name!r} has no extension, so it "
                                       "belongs to no sample column; rename it (e.g. KEY.bin) "
                                       "or remove it from the tar.")
                suffix = suffix.lower()
                if not keys or prefix != keys[-1]:
                    close()
                    if prefix in seen:
                        raise SharderError(f"{path!r}: sample key {prefix!r} appears twice (its "
                                           "files are not next to each other in the tar); write "
                                           "each sample's files together.")
                    seen.add(prefix)
                    keys.append(prefix)
                    starts.append(member.offset)
                    members.append([])
                if any(m[0] == suffix for m in members[-1]):
                    raise SharderError(f"{path!r}: duplicate file {name!r} in one sample.")
                if not pa.types.is_binary(column_type(suffix)):
                    data = tar.extractfile(member).read()  # type: ignore[union-attr]
                    typed_value(path, prefix, suffix, data)
                members[-1].append((suffix, member.offset_data, member.size))
                end = member.offset_data + -(-member.size // 512) * 512
    except SharderError:
        raise
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise SharderError(f"cannot read {path!r} as an uncompressed tar ({type(exc).__name__}: "
                           f"{exc}); the file is truncated or not a tar. Fix or remove it."
                           ) from exc
    close()
    if exts is None:
        raise SharderError(f"{path!r} holds no samples; remove the empty tar from SRC.")
    return TarLayout(tuple(starts + [end]), tuple(exts), tuple(keys),
                     tuple(tuple(m) for m in members))
