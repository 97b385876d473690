"""The front decides before it reads a body, counts connections per address as it accepts them,
names clients by the hops it trusts, and answers its own errors as JSON (issue 47, items 1, 2, 4
and 9; DESIGN §9). Real nginx, real gunicorn, real sockets: `ndstore up`'s stack.

Before: four anonymous POSTs to /v1/permissions/ declaring 1 GiB each left 1021 MiB of temp
files at the front (it read whole bodies before Django could refuse them); 4500 idle sockets from
one address took every worker connection; behind a proxy, every client shared the proxy's
per-client limits; a header too large was answered with nginx's HTML page.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from ndstore.ops.front import descriptor_budget
from ndstore.ops.localstack import LocalStack, free_port
from tests.conftest import own_stack_env
from tests.security.conftest import admin_session, public_dataset

GiB = 1 << 30
PER_ADDRESS = 40
PER_CLIENT = 12
OCTET = "application/octet-stream"


def _stack(tmp: Path, **env: str) -> LocalStack:
    return LocalStack(tmp, port=free_port(), workers=1, threads=4, with_merger=False, with_runner=False,
                      extra_env=own_stack_env({
                          "NDSTORE_ANON_READ_RATE": "0", "NDSTORE_DEMO": "0", "NDSTORE_FRONT_BODY_TIMEOUT_S": "20",
                          "NDSTORE_FRONT_CONNECTIONS_PER_ADDRESS": str(PER_ADDRESS),
                          "NDSTORE_FRONT_CONNECTIONS_PER_CLIENT": str(PER_CLIENT), **env}))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with _stack(tmp_path_factory.mktemp("admission")) as local:
        public_dataset(admin_session(local.data_dir), local.url, "adm", (512, 512, 64), {"c": {"datatype": "uint8"}})
        yield local


@pytest.fixture(scope="module")
def stranger(stack: LocalStack) -> str:
    """A token of a user who holds no grant on anything."""
    out = subprocess.run([sys.executable, "-m", "ndstore.cli", "token", "--data-dir", str(stack.data_dir),
                          "--user", "stranger"], capture_output=True, text=True, check=True).stdout
    return out.strip().split()[-1]


def _send_head(stack: LocalStack, head: str, source: str = "127.0.0.1") -> socket.socket:
    s = socket.create_connection((stack.host, stack.port), timeout=10, source_address=(source, 0))
    s.sendall(head.encode())
    return s


def _answer(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers.get("content-length", "0")):
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def _post_head(path: str, length: int, token: str | None = None, extra: str = "") -> str:
    auth = f"Authorization: Token {token}\r\n" if token else ""
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}{extra}"
            f"Content-Length: {length}\r\n\r\n")


def _temp_bytes(stack: LocalStack) -> int:
    temp = stack.data_dir / "front" / "client_body"
    return sum(f.stat().st_size for f in temp.rglob("*") if f.is_file())


def test_anonymous_bodies_are_refused_before_a_byte_is_read(stack: LocalStack) -> None:
    held = [_send_head(stack, _post_head("/v1/permissions/", GiB) + "{", ) for _ in range(4)]
    for s in held:
        status, headers, body = _answer(s)
        assert status == 401 and headers["content-type"] == "application/json", (status, body[:200])
        assert headers.get("www-authenticate") == "Token"
        assert "token is required" in body.decode()
    assert _temp_bytes(stack) == 0
    for s in held:
        s.close()


def test_a_caller_without_the_grant_or_past_the_route_bound_is_refused_unread(stack: LocalStack,
                                                                               stranger: str) -> None:
    token = (stack.data_dir / "admin_token").read_text().strip()
    cutout = "/v1/cutout/adm/e/c/0/0:64/0:64/0:8/"  # 32 KiB of uint8
    cases = [
        (_post_head(cutout, 50 << 20, stranger), 403, "lacks write permission"),
        (_post_head(cutout.replace("/v1/", "/v1/blaze/"), 50 << 20, stranger), 403, "lacks write permission"),
        (_post_head(cutout, 50 << 20, token), 413, "exceeds the"),
        (_post_head("/v1/collection/adm/", 50 << 20, token), 413, "control plane"),
        (_post_head("/v1/cutout/nope/e/c/0/0:64/0:64/0:8/", 50 << 20, token), 404, "nope"),
        (_post_head(cutout, 50 << 20, token).replace(f"Content-Length: {50 << 20}",
                                                     "Transfer-Encoding: chunked"), 411, "Content-Length"),
        (f"GET /v1/collection/ HTTP/1.1\r\nHost: x\r\nContent-Length: {1 << 20}\r\n\r\n", 413, "carries no body"),
    ]
    for head, status, words in cases:
        s = _send_head(stack, head)
        got, headers, body = _answer(s)
        s.close()
        assert got == status and headers["content-type"] == "application/json", (head[:60], got, body[:300])
        assert words in body.decode(), body
    assert _temp_bytes(stack) == 0


def test_admitted_writes_are_stored_on_every_tier(stack: LocalStack) -> None:
    s = admin_session(stack.data_dir)
    data = np.random.default_rng(1).integers(0, 255, (64, 512, 512), dtype=np.uint8)
    for prefix in ("/v1/cutout", "/latest/direct/cutout", "/v1/blaze/cutout"):
        url = f"{stack.url}{prefix}/adm/e/c/0/0:512/0:512/0:64/"
        r = s.post(url, data=data.tobytes(), headers={"Content-Type": OCTET}, timeout=120)
        assert r.status_code == 201, (prefix, r.text)
        back = s.get(url, headers={"Accept": OCTET}, timeout=120)
        assert np.array_equal(np.frombuffer(back.content, np.uint8).reshape(data.shape), data), prefix


def test_refusals_of_the_control_plane_are_audited(stack: LocalStack) -> None:
    s = _send_head(stack, _post_head("/v1/coord/audited_refusal/", 5 << 20))
    assert _answer(s)[0] == 401
    s.close()
    entries = admin_session(stack.data_dir).get(f"{stack.url}/v1/audit/", timeout=30).json()["entries"]
    assert any(e["path"] == "/v1/coord/audited_refusal/" and e["status"] == 401 for e in entries), entries[:3]


def test_one_address_holds_a_bounded_share_of_the_connections(stack: LocalStack) -> None:
    conf = (stack.data_dir / "front" / "nginx.conf").read_text()
    assert re.search(rf"worker_connections {descriptor_budget()[1]};", conf)
    attacker = [socket.create_connection((stack.host, stack.port), source_address=("127.0.0.2", 0), timeout=5)
                for _ in range(PER_ADDRESS + 30)]
    try:
        time.sleep(0.5)
        closed = 0
        for s in attacker:
            s.settimeout(0.2)
            try:
                closed += s.recv(1) == b""
            except (TimeoutError, ConnectionResetError):
                closed += isinstance(sys.exc_info()[1], ConnectionResetError)
        assert closed >= 30, f"only {closed} of the address's connections past its {PER_ADDRESS} were closed"
        for _ in range(PER_ADDRESS + 5):  # another address is served as usual
            r = requests.get(f"{stack.url}/v1/collection/", timeout=30)
            assert r.status_code == 200
    finally:
        for s in attacker:
            s.close()


@pytest.mark.parametrize("head, status", [
    ("GET /v1/collection/ HTTP/1.1\r\nHost: x\r\nX-Big: " + "a" * 20000 + "\r\n\r\n", 400),
    ("GET /v1/collection/ HTTP/1.1\r\nHost: x\r\nX-Nul: a\0b\r\n\r\n", 400),
    ("GET /v1/collection/?" + "a" * 20000 + " HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    ("GET /v1/collection/?" + "a" * 6000 + " HTTP/1.1\r\nHost: x\r\n\r\n", 200),  # past gunicorn's own default
    ("GET /v1/collection/ HTTP/1.1\r\nHost: x\r\n" + "X-F: y\r\n" * 300 + "\r\n", 200),
    ("BREW /v1/collection/ HTCPCP/1.0\r\n\r\n", 400),
])
def test_malformed_requests_are_answered_in_json(stack: LocalStack, head: str, status: int) -> None:
    s = _send_head(stack, head)
    got, headers, body = _answer(s)
    s.close()
    assert got == status, (got, body[:300])
    assert headers.get("content-type") == "application/json", (headers, body[:300])
    if status >= 400:
        assert b'"message"' in body


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """A node behind one trusted proxy (compose's nginx, an ALB): its TCP peers are the proxy."""
    with _stack(tmp_path_factory.mktemp("proxied"), NDSTORE_NUM_PROXIES="1") as local:
        requests.get(f"{local.url}/healthz", timeout=60)  # the worker's first request loads the app
        yield local


def test_behind_a_proxy_limits_count_each_client_not_the_proxy(proxied: LocalStack) -> None:
    token = (proxied.data_dir / "admin_token").read_text().strip()
    head = (f"GET /v1/collection/ HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 203.0.113.7\r\n"
            f"Authorization: Token {token}\r\n\r\n")
    # one client holds its every slot with requests that stall (an unfinished body it was allowed)
    body = _post_head("/v1/coord/held/", 50_000, token, "X-Forwarded-For: 203.0.113.7\r\n") + "{"
    held = [_send_head(proxied, body) for _ in range(PER_CLIENT)]
    try:
        time.sleep(0.5)
        s = _send_head(proxied, head)
        assert _answer(s)[0] == 503  # that client is past its limit
        s.close()
        for other in ("198.51.100.9", "198.51.100.10"):  # other clients behind the same proxy are not
            r = requests.get(f"{proxied.url}/v1/collection/", timeout=30,
                             headers={"X-Forwarded-For": other, "Authorization": f"Token {token}"})
            assert r.status_code == 200, (other, r.status_code, r.text[:200])
    finally:
        for s in held:
            s.close()
    s = _send_head(proxied, _post_head("/v1/coord/from_client/", 2, None, "X-Forwarded-For: 198.51.100.77\r\n") + "{}")
    assert _answer(s)[0] == 401
    s.close()
    entries = admin_session(proxied.data_dir).get(f"{proxied.url}/v1/audit/", timeout=30).json()["entries"]
    assert any(e["path"] == "/v1/coord/from_client/" and e["remote_addr"] == "198.51.100.77" for e in entries)
