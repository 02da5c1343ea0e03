"""``stoker audit``: prove which samples a run consumed, in which order, and how fast.

:func:`audit` reads one run (or two, to compare), runs every check and returns an
:class:`~stoker.tools.audit.report.AuditReport`; rendering (terminal, JSON, HTML) is separate.
Checks: identity, stream (continuity, truncation), resumes, events, replay, content (the
delivered bytes against the verified shards), coverage,
comparison (with a second run), integrity (shards re-hashed), stall (info only). A run over a
mixture replaces coverage with per-source coverage per pass and realised proportions, and
rebuilds its merged batches from every source (stoker.tools.audit.mixture_content).
"""

from __future__ import annotations

import os

from stoker.tools.audit.compare import compare_check
from stoker.tools.audit.content import content_check
from stoker.tools.audit.coverage import coverage_check
from stoker.tools.audit.integrity import integrity_check
from stoker.tools.audit.mixture import (MixtureView, integrity_of_sources, open_mixture,
                                        source_checks)
from stoker.tools.audit.mixture_content import mixture_content_check
from stoker.tools.audit.replay import open_dataset, replay_check
from stoker.tools.audit.report import AuditReport, Check
from stoker.tools.audit.run import load_run
from stoker.tools.audit.stall import stall_check
from stoker.tools.audit.stream import events_check, identity_check, resume_check, stream_check

__all__ = ["audit"]


def audit(run: str | os.PathLike[str], run2: str | os.PathLike[str] | None = None, *,
          dataset: str | None = None, verify: bool = True, sample: float = 1.0) -> AuditReport:
    """Audit the run at ``run`` (a ledger or a directory of per-rank ledgers).

    Args:
        run: the run to audit.
        run2: a second run to compare with (first divergence, header differences).
        dataset: where the dataset lives now, if not where the ledger says.
        verify: re-hash the shards of a local dataset.
        sample: share of the steps whose delivered content is rebuilt and compared.
    """
    first = load_run(run)
    view = open_mixture(first.header, dataset) if first.header.get("kind") == "mixture" \
        else open_dataset(first.header, dataset)  # a mixture: stoker.tools.audit.mixture
    checks: list[Check] = [identity_check(first), stream_check(first), resume_check(first),
                           events_check(first)]
    replay, match = replay_check(first, view)
    series: dict = {}
    if isinstance(view, MixtureView):
        sources, proportions, series["mixture"] = source_checks(first, view, match)
        checks += [replay, mixture_content_check(first, view, sample), sources, proportions]
    else:
        checks += [replay, content_check(first, view, sample), coverage_check(first, match)]
    if run2 is not None:
        second = load_run(run2)
        replayer = view.replayer() if view.shard_rows is not None else None
        match2 = None
        same_data = second.header.get("fingerprint") == first.header.get("fingerprint")
        if replayer is not None and same_data:
            match2 = replay_check(second, view)[1]
        checks.append(compare_check(first, second, replayer, match, match2))
    checks.append(integrity_of_sources(view, verify) if isinstance(view, MixtureView)
                  else integrity_check(view, verify))
    stall, series["stall"] = stall_check(first)
    checks.append(stall)
    runs = [os.fspath(run)] + ([os.fspath(run2)] if run2 is not None else [])
    return AuditReport(runs, checks, series)
