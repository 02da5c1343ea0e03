"""``stoker serve --dask``: one server per worker of a Dask LocalCluster, stopped cleanly."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from batch_equality import assert_batches_equal
from serve_data import W1_KW
from stoker.loader import DataLoader, WorkerOptions
from stoker.loader.service.errors import ServiceUnavailableError
from stoker.loader.service.options import Service

pytestmark = [pytest.mark.remote, pytest.mark.timeout(300)]
KW = dict(batch_size=64, shuffle=True, seed=2, **W1_KW)


def test_dask_launch_serves_and_stops(w1: Path) -> None:
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1",
                                  dashboard_address=None, processes=True) as cluster:
        cli = subprocess.Popen([sys.executable, "-m", "stoker.tools", "serve", "--dask",
                                cluster.scheduler_address, str(w1)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            urls = [cli.stdout.readline().strip() for _ in range(2)]  # type: ignore[union-attr]
            assert all(u.startswith("grpc://127.0.0.1:") for u in urls), urls
            local = list(DataLoader(w1, **KW))
            loader = DataLoader(w1, workers=WorkerOptions(service=urls), **KW)
            served = list(loader)
            assert len(served) == len(local)
            for x, y in zip(local, served):
                assert_batches_equal(x, y)
            loader.close()
        finally:
            cli.send_signal(signal.SIGTERM)
            code = cli.wait(timeout=60)
        err = cli.stderr.read()  # type: ignore[union-attr]
        assert code == 0, err
        assert "stopped 2 servers" in err
        with pytest.raises(ServiceUnavailableError):  # the servers are gone
            next(iter(DataLoader(w1, workers=WorkerOptions(service=Service(urls, timeout=1.0)),
                                 **KW)))
