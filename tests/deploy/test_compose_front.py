"""deploy/nginx.conf run here (nginx from system-deps, the certificate as compose's `tls` service
makes it) before a web node that echoes what it is told: https on its 443, http on its 80, and the
web node learns which one the client used (X-Forwarded-Proto), which it trusts behind one proxy
(NDSTORE_NUM_PROXIES: Django's request.is_secure(), the links it builds)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from ndstore.ops.localstack import free_port
from tests.deploy.test_static import local_nginx_config

pytestmark = pytest.mark.skipif(shutil.which("nginx") is None or shutil.which("openssl") is None,
                                reason="nginx and openssl run compose's front here where they are installed")


class Echo(BaseHTTPRequestHandler):
    """A web node that answers every GET with the headers it was sent."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = json.dumps(dict(self.headers.items())).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def echo() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_compose_front_serves_https_and_http_and_tells_the_web_node_which(tmp_path: Path, echo: str) -> None:
    nginx = shutil.which("nginx")
    assert nginx is not None
    http, https = free_port(), free_port()
    conf = local_nginx_config(tmp_path, nginx, f"127.0.0.1:{http}", f"127.0.0.1:{https}", upstream=echo)
    proc = subprocess.Popen([nginx, "-c", str(conf), "-p", str(tmp_path),
                             "-g", f"daemon off; pid {tmp_path}/nginx.pid;"], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not (_listening(http) and _listening(https)):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else "nginx exited"
            assert time.monotonic() < deadline, "nginx did not listen"
            time.sleep(0.05)
        # the certificate names 127.0.0.1: it verifies against itself, as a browser told to trust it would
        secure = requests.get(f"https://127.0.0.1:{https}/v1/collection/", verify=tmp_path / "tls" / "cert.pem",
                              timeout=10)
        assert secure.status_code == 200, secure.text
        assert secure.json()["X-Forwarded-Proto"] == "https" and secure.json()["Host"] == f"127.0.0.1:{https}"
        assert secure.json()["X-Forwarded-For"] == "127.0.0.1"
        plain = requests.get(f"http://127.0.0.1:{http}/precomputed/x/info", timeout=10)
        assert plain.status_code == 200 and plain.json()["X-Forwarded-Proto"] == "http"
        with pytest.raises(requests.exceptions.SSLError):  # not a certificate anyone trusts by default
            requests.get(f"https://127.0.0.1:{https}/", timeout=10)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
