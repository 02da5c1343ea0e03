"""nginx from the Debian package, run by the test itself on a loopback port."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NginxRequest", "NginxServer", "nginx_binary"]


def nginx_binary() -> str | None:
    """Path of the nginx executable, or None when it is not installed."""
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None)


@dataclass(frozen=True)
class NginxRequest:
    uri: str
    status: int
    range: str


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_CONF = """
{user}
daemon off;
worker_processes 2;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 512; }}
http {{
    log_format counts '$request_uri $status "$http_range"';
    access_log {prefix}/access.log counts;
    client_body_temp_path {prefix}/tmp/body;
    proxy_temp_path {prefix}/tmp/proxy;
    fastcgi_temp_path {prefix}/tmp/fastcgi;
    uwsgi_temp_path {prefix}/tmp/uwsgi;
    scgi_temp_path {prefix}/tmp/scgi;
    types {{ application/octet-stream arrow; application/json json; }}
    sendfile on;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location / {{ }}
    }}
}}
"""


class NginxServer:
    """Serve ``root`` over HTTP on 127.0.0.1; ``url`` is its base URL."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        binary = nginx_binary()
        if binary is None:
            raise RuntimeError("nginx is not installed; run tools/ci_system_deps.sh "
                               "(apt-get install nginx).")
        self._prefix = Path(tempfile.mkdtemp(prefix="stoker-nginx-"))
        (self._prefix / "tmp").mkdir()
        self.root = Path(root).resolve()
        self._proc: subprocess.Popen[bytes] | None = None
        for _ in range(5):  # a free port can be taken between probe and bind: retry
            self.port = _free_port()
            conf = self._prefix / "nginx.conf"
            # Workers drop privileges only when the master is root; then they must stay root to
            # read test directories created with mode 0700.
            user = "user root;" if os.geteuid() == 0 else ""
            conf.write_text(_CONF.format(user=user, prefix=self._prefix, port=self.port,
                                         root=self.root))
            self._proc = subprocess.Popen(
                [binary, "-p", str(self._prefix), "-e", str(self._prefix / "error.log"),
                 "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            if self._wait_ready():
                break
            self._stop_proc()
        else:
            err = (self._prefix / "error.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"nginx did not start: {err}")
        self.url = f"http://127.0.0.1:{self.port}"

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                return False
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return True
            time.sleep(0.01)
        return False

    def requests(self) -> list[NginxRequest]:
        """Every request served so far, in order (nginx writes the log line on completion)."""
        log = self._prefix / "access.log"
        if not log.exists():
            return []
        out = []
        for line in log.read_text().splitlines():
            uri, status, rng = line.split(" ", 2)
            out.append(NginxRequest(uri, int(status), rng.strip('"')))
        return out

    def _stop_proc(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc is not None and self._proc.stderr is not None:
            self._proc.stderr.close()
        self._proc = None

    def close(self) -> None:
        self._stop_proc()
        shutil.rmtree(self._prefix, ignore_errors=True)

    def __enter__(self) -> "NginxServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
