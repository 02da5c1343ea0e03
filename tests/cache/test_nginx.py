"""Our HTTP client against a real server (nginx): resume with Range + If-Range, as nginx does it."""

from __future__ import annotations

import http.client
from pathlib import Path

import pytest

from stoker.cache import RetryPolicy, ShardCache
from stoker.cache.fetch.download import Job, download
from stoker.cache.fetch.http import HttpFetcher
from stoker.cache.stats import _Counters
from stoker.manifest import Manifest

pytestmark = pytest.mark.remote
POLICY = RetryPolicy(max_retries=2, backoff_base=0.01)


def _resume(url: str, good: bytes, prefix: bytes, etag: str | None, part: Path) -> _Counters:
    counters = _Counters()
    with open(part, "wb") as f:
        job = Job(url, url, "shards/00000.arrow", len(good), f, counters)
        job.write(prefix)  # what an earlier, interrupted attempt left
        job.etag = etag
        download(HttpFetcher(None, POLICY), job, POLICY, counters)
    return counters


def test_resume_and_changed_object_against_nginx(dataset, nginx, tmp_path: Path) -> None:
    root, manifest = dataset(n_shards=1)
    server = nginx(root)
    url = f"{server.url}/shards/00000.arrow"
    good = (root / "shards/00000.arrow").read_bytes()
    with ShardCache(Manifest.load(server.url), tmp_path / "c", prefetch_workers=0,
                    retry=POLICY) as cache:
        assert Path(cache.path(0)).read_bytes() == good
    first = server.requests()[-1]
    assert (first.uri, first.status, first.range) == ("/shards/00000.arrow", 200, "-")
    conn = http.client.HTTPConnection("127.0.0.1", server.port)
    conn.request("HEAD", "/shards/00000.arrow")
    etag = conn.getresponse().getheader("ETag")
    conn.close()

    # Same object: nginx honours Range + If-Range with 206, the bytes are appended.
    half = len(good) // 2
    counters = _resume(url, good, good[:half], etag, tmp_path / "a")
    assert (tmp_path / "a").read_bytes() == good and counters.snapshot().restarts == 0
    last = server.requests()[-1]
    assert (last.status, last.range) == (206, f"bytes={half}-")

    # Changed object (stale ETag): nginx answers 200 with the whole body; nothing is spliced.
    counters = _resume(url, good, b"\0" * half, '"0-stale"', tmp_path / "b")
    assert (tmp_path / "b").read_bytes() == good and counters.snapshot().restarts == 1
    assert server.requests()[-1].status == 200
