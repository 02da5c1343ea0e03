"""moto's standalone S3 server on a loopback port (real HTTP, real botocore signing)."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["S3Server"]


class S3Server:
    """A moto S3 endpoint on 127.0.0.1; ``endpoint`` is its URL."""

    def __init__(self, key: str = "testing-key", secret: str = "testing-secret") -> None:
        from moto.server import ThreadedMotoServer

        # botocore must never pick up real credentials or reach real AWS from a test.
        for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
            os.environ.pop(var, None)
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.key, self.secret = key, secret

    def storage_options(self) -> dict[str, Any]:
        """Options for ``s3fs.S3FileSystem`` / fsspec pointing at this server."""
        return {"key": self.key, "secret": self.secret,
                "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "us-east-1"},
                "skip_instance_cache": True}

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=self.key, aws_secret_access_key=self.secret)

    def upload_dir(self, local: str | os.PathLike[str], bucket: str, prefix: str) -> str:
        """Create ``bucket`` and upload every file under ``local`` to ``prefix``; return the URL."""
        client = self.client()
        existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
        if bucket not in existing:
            client.create_bucket(Bucket=bucket)
        root = os.fspath(local)
        for dirpath, _, files in os.walk(root):
            for name in files:
                path = os.path.join(dirpath, name)
                key = f"{prefix}/{os.path.relpath(path, root)}".replace(os.sep, "/")
                client.upload_file(path, bucket, key)
        return f"s3://{bucket}/{prefix}"

    def close(self) -> None:
        self._server.stop()

    def __enter__(self) -> "S3Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
