"""The ledger a DataLoader writes: its header describes the run (split from dataloader.py).

Besides what an audit needs to replay the order, the header says when there is no order
contract to replay: ``"in_order": false`` (batches yielded as they were ready) and
``"iterable": "order not guaranteed"`` (an IterableDataset: content digests only).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stoker.loader.dataloader import DataLoader

__all__ = ["ledger_header", "open_ledger"]


def ledger_header(loader: DataLoader) -> dict[str, Any]:
    """The JSON-plain description of ``loader``'s run."""
    plan = loader._configured()
    header = {
        "dataset": loader.location, "fingerprint": loader._source.fingerprint,
        "num_samples": plan.num_samples, "seed": loader.seed,
        "order": loader.order_options.to_dict(), "global_batch": plan.global_batch,
        "world_size": loader.world_size, "rank": loader.rank, "drop_last": loader.drop_last,
        "num_workers": loader.num_workers, "worker_mode": loader.worker_mode,
        "start_epoch": loader.epoch, "start_step": loader._cursor.step, "kind": loader._source.kind,
        "mode": loader._mode,
        "sample_seeding": loader.sample_seeding,
    }
    if not loader.in_order:  # batches are yielded as they are ready: no order contract
        header["in_order"] = False
    if loader._mode == "iterable":
        header["iterable"] = "order not guaranteed"
    if loader._source.kind == "torch":
        header["dataset_len"] = plan.num_samples
    if loader._source.kind == "mixture":
        header["mixture"] = loader._source.mixture.describe()
    if loader.working_set is not None:
        header["working_set"] = loader.working_set.to_dict()
    if loader._content is not None:
        header["content"] = loader._content
    if getattr(loader, "_service", None) is not None:  # batches from `stoker serve`
        header["service"] = loader._source.describe()
    return header


def open_ledger(loader: DataLoader) -> Any:
    """A LedgerWriter for ``loader`` at its ledger path, with a pending resume recorded.

    Refused (:class:`~stoker.loader.ledger.writer.LedgerError`) when another live loader writes that
    ledger, or when it holds progress of this or another run and ``loader`` was not resumed
    from a state nor continues exactly where it ends (stoker.loader.ledger.restart).
    """
    from stoker.loader.ledger.writer import LedgerWriter
    from stoker.loader.ledger.restart import check_continues

    header = ledger_header(loader)
    try:
        steps: int | None = len(loader)
    except TypeError:  # an IterableDataset without a length
        steps = None
    check = functools.partial(check_continues, header=header,
                              start=(loader.epoch, loader._cursor.step),
                              resumed=loader._resumed_from is not None, steps_per_epoch=steps,
                              path=loader._options.ledger.path)
    ledger = LedgerWriter(loader._options.ledger.path, header, ids=loader._options.ledger.ids,
                          check=check)
    if loader._resumed_from is not None:
        ledger.event("resume", state=loader._resumed_from)
        loader._resumed_from = None
    return ledger
