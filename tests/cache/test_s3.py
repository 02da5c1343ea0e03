"""s3:// datasets through fsspec/s3fs against moto's standalone S3 server on loopback."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from stoker.cache import RemoteFetchError, RetryPolicy, ShardCache, open_dataset
from stoker.manifest import Manifest, ShardIntegrityError

pytestmark = pytest.mark.remote
FAST = RetryPolicy(max_retries=2, backoff_base=0.01, backoff_max=0.02)


def _upload(s3, root: Path) -> str:
    return s3.upload_dir(root, f"b-{uuid.uuid4().hex[:12]}", "datasets/ds")


def test_s3_dataset_is_cached_byte_identical(dataset, s3, tmp_path: Path) -> None:
    root, manifest = dataset(n_shards=3)
    big_root, _ = dataset(n_shards=1, rows=300, blob=32768)  # > one 8 MiB ranged read
    for r in (root, big_root):
        url = _upload(s3, r)
        m, cache = open_dataset(url, cache_dir=tmp_path / "c", storage_options=s3.storage_options(),
                                prefetch_workers=1, retry=FAST)
        assert cache is not None
        with cache:
            cache.set_future(range(m.num_shards))
            for i in range(m.num_shards):
                with cache.pin(i) as local:
                    assert Path(local).read_bytes() == (r / m.shards[i].path).read_bytes()
            assert cache.stats().bytes_fetched == int(m.shard_bytes.sum())


def test_missing_object_fails_fast_without_secrets(dataset, s3, tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="stoker")
    root, _ = dataset(n_shards=2)
    url = _upload(s3, root)
    bucket = url.split("/")[2]
    s3.client().delete_object(Bucket=bucket, Key="datasets/ds/shards/00001.arrow")
    opts = s3.storage_options()
    manifest = Manifest.load(url, opts)
    with ShardCache(manifest, tmp_path / "c", storage_options=opts, prefetch_workers=0,
                    retry=FAST) as cache:
        cache.path(0)
        with pytest.raises(RemoteFetchError) as err:
            cache.path(1)
        stats = repr(cache.stats())
    msg = str(err.value)
    assert f"{url}/shards/00001.arrow" in msg and "not retried" in msg
    assert err.value.attempts == 1
    for text in (msg, caplog.text, stats, repr(cache)):
        assert s3.secret not in text and s3.key not in text


def test_corrupt_object_is_an_integrity_error(dataset, s3, tmp_path: Path) -> None:
    root, manifest = dataset(n_shards=1)
    url = _upload(s3, root)
    good = (root / manifest.shards[0].path).read_bytes()
    s3.client().put_object(Bucket=url.split("/")[2], Key="datasets/ds/shards/00000.arrow",
                           Body=good[:-1] + bytes([good[-1] ^ 1]))
    opts = s3.storage_options()
    with ShardCache(Manifest.load(url, opts), tmp_path / "c", storage_options=opts,
                    prefetch_workers=0, retry=FAST) as cache:
        with pytest.raises(ShardIntegrityError, match=r"shard 0 .*failed verification twice"):
            cache.path(0)
        assert cache.stats().quarantines == 2


def test_resume_against_a_replaced_object_restarts_from_zero(dataset, s3, tmp_path: Path) -> None:
    from stoker.cache.fetch.download import Job, download
    from stoker.cache.fetch.fsspec import FsspecFetcher
    from stoker.cache.stats import _Counters

    root, manifest = dataset(n_shards=1)
    url = _upload(s3, root) + "/shards/00000.arrow"
    good = (root / manifest.shards[0].path).read_bytes()
    counters = _Counters()
    with open(tmp_path / "part", "wb") as f:
        job = Job(url, url, "shards/00000.arrow", len(good), f, counters)
        job.write(b"\0" * 100)  # bytes of an older version of the object, from an earlier try
        job.etag = '"0123456789abcdef0123456789abcdef"'
        download(FsspecFetcher(s3.storage_options()), job, FAST, counters)
    assert (tmp_path / "part").read_bytes() == good  # IfMatch failed (412): no splice
    assert counters.snapshot().restarts == 1 and counters.snapshot().retries == 1
