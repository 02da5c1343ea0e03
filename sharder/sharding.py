"""``stoker.sharder.shard``: any supported source -> deterministic Arrow IPC shards + manifest."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from stoker.manifest import Manifest, ShardInfo, stoker_version
from stoker.sharder.build import Build, check_destination, clear_directory, remove_temp_files
from stoker.sharder.errors import SharderError
from stoker.sharder.executor import Executor, LocalExecutor
from stoker.sharder.inputs import source_roots
from stoker.sharder.options import BATCH_BYTES, BATCH_ROWS, ShardOptions
from stoker.sharder.plan import Plan, make_plan
from stoker.sharder.progress import progress_bar
from stoker.sharder.sources import discover, manifest_classes
from stoker.sharder.writer import HashTask, ShardGroup, ShardTask, Task, run_task

__all__ = ["shard"]

_log = logging.getLogger(__name__)
# Formats read by streaming from the file start (no row index): their shards are grouped.
_STREAMED = ("csv", "jsonl", "webdataset")
Source = str | os.PathLike[str]
T = TypeVar("T")


def shard(src: Source | Sequence[Source], dst: Source, *, rows_per_shard: int | None = None,
          shard_size: int | str | None = None, compression: str = "none",
          columns: Sequence[str] | None = None, workers: int = 1, overwrite: bool = False,
          format: str | None = None, progress: bool | None = None,
          executor: Executor | None = None, token_dtype: str | None = None,
          seq_len: int | None = None, on_bad: str = "error", batch_bytes: int = BATCH_BYTES,
          batch_rows: int = BATCH_ROWS) -> Manifest:
    """Convert ``src`` into a stoker dataset at ``dst`` and return its manifest.

    The plan (sorted inputs, exact rows, shard boundaries) is a pure function of the inputs
    and the options, and each shard is written independently from it, so the output is
    byte-identical for any ``workers`` or executor. An interrupted run resumes when run
    again with the same arguments; ``manifest.json`` is written last.

    Args:
        src: Parquet/CSV/JSONL/tar/token file, directory (hive partitions become columns; an
            image-folder tree; a save_to_disk directory) or glob,
            or a list of them.
        dst: output directory: new, empty, or a build in progress; anything else needs
            ``overwrite=True``.
        rows_per_shard: exact rows per shard (last smaller); exclusive with ``shard_size``.
        shard_size: uncompressed bytes per shard (``"256MB"``), the default when neither is given.
        compression: ``"none"`` or ``"zstd"`` (Arrow IPC buffer compression).
        columns: columns to keep, in this order.
        workers: processes writing shards (1 runs in this process). Workers start with
            ``forkserver`` (``spawn`` where missing), which imports ``__main__``: a script
            calling ``shard(workers=N)`` needs the ``if __name__ == "__main__":`` guard.
        overwrite: replace an existing dataset or non-empty directory at ``dst``.
        format: ``"parquet"``, ``"csv"``, ``"jsonl"``, ``"webdataset"``, ``"imagefolder"``,
            ``"hf"`` or ``"tokens"``; detected (extensions, directory layout) if omitted.
        progress: show a progress bar on stderr; ``None`` shows one when stderr is a terminal.
        executor: run tasks on this engine instead of a local pool of ``workers``
            (e.g. ``stoker.sharder.executor_dask.DaskExecutor``).
        token_dtype, seq_len: for token files (see stoker.sharder.sources.tokens).
        on_bad: ``"error"`` or ``"skip"`` (image folders: unreadable images are left out and
            listed in the manifest; see stoker.sharder.sources.images).
        batch_bytes, batch_rows: a record batch holds ``batch_bytes`` of rows, at most
            ``batch_rows`` (1,024 by default: a staged run of rows is then one or two byte
            ranges of a shard, :data:`stoker.sharder.options.BATCH_ROWS`).

    Raises:
        SharderError: bad or missing input, schema mismatch, no rows, unusable ``dst``,
            disk full (nothing is lost: no manifest, no temp files, finished shards kept).
    """
    sources = [src] if isinstance(src, (str, os.PathLike)) else list(src)
    options = ShardOptions(rows_per_shard=rows_per_shard, shard_size=shard_size,
                           compression=compression,
                           columns=None if columns is None else tuple(columns), format=format,
                           token_dtype=token_dtype, seq_len=seq_len, on_bad=on_bad,
                           batch_bytes=batch_bytes, batch_rows=batch_rows)
    LocalExecutor(workers)  # validates ``workers`` before any work is done
    dst_path = Path(os.path.abspath(os.fspath(dst)))
    inputs = discover(sources, options)
    _check_not_nested(sources, [f.path for f in inputs], dst_path)
    state = check_destination(dst_path, overwrite)
    plan = make_plan(inputs, options)
    _prepare(dst_path, state)
    build = Build(dst_path, plan)
    _guard_os(build.start, dst_path)
    shards, hashed = build.finished()
    if shards:
        _log.info("resuming: %d of %d shards already done", len(shards), plan.num_shards)
    # an executor says how many tasks run at once (e.g. a Dask cluster's worker count)
    parallel = getattr(executor, "workers", workers) if executor is not None else workers
    shard_tasks = _shard_tasks(plan, build, [i for i in range(plan.num_shards) if i not in shards],
                               parallel)
    tasks = shard_tasks + [HashTask(i, f.path, f.rel, build.source_record(i))
                           for i, f in enumerate(plan.inputs) if i not in hashed]
    # A pool only pays off with several shard tasks; its start-up costs ~0.5 s.
    engine = executor if executor is not None else \
        LocalExecutor(max(1, min(workers, len(shard_tasks))))
    _execute(engine, tasks, build, shards, hashed, progress)
    manifest = _manifest(plan, shards, hashed)
    _guard_os(lambda: manifest.save(dst_path), dst_path)
    build.finish()
    return Manifest.load(dst_path)


def _shard_tasks(plan: Plan, build: Build, pending: list[int], workers: int) -> list[Task]:
    """One task per Parquet (image-folder, HF, token) shard: it reads only its rows. CSV/JSONL
    and tars have no row index, so each file's consecutive shards go in up to ``workers`` groups that stream it
    once each, instead of every shard re-reading the file from its start."""
    single = [_shard_task(plan, build, i) for i in pending]
    if plan.options["format"] not in _STREAMED:
        return list(single)
    runs: list[list[ShardTask]] = []
    for task in single:
        first = task.pieces[0].file.path
        if runs and runs[-1][-1].pieces[0].file.path == first \
                and runs[-1][-1].index + 1 == task.index:
            runs[-1].append(task)
        else:
            runs.append([task])
    groups: list[Task] = []
    for run in runs:
        size = -(-len(run) // max(1, workers))
        groups += [ShardGroup(tuple(run[k:k + size])) for k in range(0, len(run), size)]
    return groups


def _shard_task(plan: Plan, build: Build, index: int) -> ShardTask:
    return ShardTask(index, str(build.dst), plan.shard_path(index), build.shard_record(index),
                     tuple(plan.pieces(index)), plan.file_schema, plan.partition_fields,
                     plan.schema, plan.options["compression"], plan.options["batch_bytes"],
                     plan.options["batch_rows"])


def _execute(engine: Executor, tasks: list[Task], build: Build,
             shards: dict[int, dict[str, Any]], hashed: dict[int, dict[str, Any]],
             progress: bool | None) -> None:
    """Run the pending tasks, filling ``shards``/``hashed`` with their results."""
    bar = progress_bar(build.plan.num_rows, "shard", "rows", progress)
    bar.update(sum(r["rows"] for r in shards.values()))
    try:
        for results in engine.map(run_task, tasks):
            for result in results:
                (shards if result["kind"] == "shard" else hashed)[result["index"]] = result
                bar.update(result["rows"])
    except BaseException:
        remove_temp_files(build.dst)  # the executor has stopped every task by now
        raise
    finally:
        bar.close()


def _manifest(plan: Plan, shards: dict[int, dict[str, Any]],
              hashed: dict[int, dict[str, Any]]) -> Manifest:
    infos = [ShardInfo(r["path"], r["rows"], r["bytes"], r["xxh3_128"], tuple(r["batch_rows"]),
                       {"arrow_bytes": r["arrow_bytes"]})
             for r in (shards[i] for i in range(plan.num_shards))]
    sources = [{"path": r["path"], "bytes": r["bytes"], "xxh3_128": r["xxh3_128"]}
               for r in (hashed[i] for i in range(len(plan.inputs)))]
    return Manifest.create(schema=plan.schema, shards=infos, sources=sources,
                           options=plan.options, stoker_version=stoker_version(),
                           compression=plan.options["compression"],
                           classes=manifest_classes(plan.inputs))


def _check_not_nested(sources: Sequence[Source], inputs: Sequence[str], dst: Path) -> None:
    real_dst = os.path.realpath(dst)
    for src, root in zip(sources, source_roots(sources)):
        if os.path.isdir(src) and _inside(real_dst, os.path.realpath(root)):
            raise SharderError(f"DST {str(dst)!r} is inside SRC {os.fspath(src)!r}; the shards "
                               "would be mixed into the input. Choose a DST outside SRC.")
    for path in inputs:
        if _inside(os.path.realpath(path), real_dst):
            raise SharderError(f"input {path!r} is inside DST {str(dst)!r}; writing there could "
                               "destroy it. Choose a DST outside SRC.")


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _prepare(dst: Path, state: str) -> None:
    def make() -> None:
        if state == "replace":
            clear_directory(dst)
        dst.mkdir(parents=True, exist_ok=True)
    _guard_os(make, dst)


def _guard_os(fn: Callable[[], T], dst: Path) -> T:
    """Run ``fn``; turn an OS error about ``dst`` into a clear SharderError."""
    try:
        return fn()
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            remove_temp_files(dst)
            raise SharderError(f"disk full while writing into DST {str(dst)!r}; no manifest "
                               "was written. Free space or choose another DST, then run again."
                               ) from exc
        raise SharderError(f"DST {str(dst)!r} is not writable ({type(exc).__name__}: "
                           f"{exc.strerror or exc}); choose a directory you can write to.") from exc
