"""A slow or stalled client costs a socket in the front, never a web worker (issue 21).

One `ndstore up` stack with a single gunicorn worker of two threads: before the front, eight
connections sending half a request line took every thread until they closed. Here dozens of
attackers, anonymous and with no valid token, hold connections open in every way a client can
(an unfinished request line, unfinished headers, a body trickled a byte at a time, a large
response never read) while a normal client's requests are answered at once; then the front drops
the stalled ones after its timeouts.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
import requests

from ndstore.ops.localstack import LocalStack, free_port
from tests.conftest import own_stack_env
from tests.security.conftest import admin_session, public_dataset

HEADER_TIMEOUT_S = 4
BODY_TIMEOUT_S = 4
# a normal request's bound while others stall: under the front's timeouts, so a request that waited
# for the front to drop the stalled ones fails, with room for a loaded machine's own slowness
SERVED_WITHIN_S = 3
CONNECTIONS_PER_CLIENT = 48


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with LocalStack(tmp_path_factory.mktemp("slow-clients"), port=free_port(), workers=1, threads=2,
                    with_merger=False, with_runner=False, extra_env=own_stack_env({
                        "NDSTORE_FRONT_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
                        "NDSTORE_FRONT_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
                        "NDSTORE_FRONT_CONNECTIONS_PER_CLIENT": str(CONNECTIONS_PER_CLIENT),
                        # the bodies' own limit (test_front_admission.py) is not what these tests try
                        "NDSTORE_FRONT_BODIES_PER_CLIENT": str(4 * CONNECTIONS_PER_CLIENT),
                        "NDSTORE_ANON_READ_RATE": "0", "NDSTORE_DEMO": "0"})) as local:
        yield local


@pytest.fixture(scope="module")
def token(stack: LocalStack) -> str:
    return (stack.data_dir / "admin_token").read_text().strip()


@pytest.fixture(scope="module")
def public_channel(stack: LocalStack) -> str:
    """A public uint8 channel of 512 x 512 x 64 voxels: its whole box is a 16 MiB raw response."""
    public_dataset(admin_session(stack.data_dir), stack.url, "slow", (512, 512, 64),
                   {"c": {"datatype": "uint8"}})
    return f"{stack.url}/v1/cutout/slow/e/c/0/0:512/0:512/0:64/"


def _connect(stack: LocalStack) -> socket.socket:
    return socket.create_connection((stack.host, stack.port), timeout=5)


def _stall(stack: LocalStack, public_channel: str) -> list[socket.socket]:
    """Thirty-six connections, each holding on to the service in its own way."""
    path = public_channel.split(str(stack.port), 1)[1]
    held = []
    for _ in range(10):  # half a request line
        s = _connect(stack)
        s.sendall(b"GET /v1/collection/ HT")
        held.append(s)
    for _ in range(10):  # a request line and some headers, never the blank line that ends them
        s = _connect(stack)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nAccept: application/octet-stream\r\n".encode())
        held.append(s)
    for _ in range(10):  # a body promised at 64 MiB and trickled
        s = _connect(stack)
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
                  f"Content-Length: {64 << 20}\r\n\r\n".encode() + b"\0")
        held.append(s)
    for _ in range(6):  # a 16 MiB response asked for and never read
        s = _connect(stack)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nAccept: application/octet-stream\r\n\r\n".encode())
        held.append(s)
    return held


def test_stalled_connections_do_not_block_a_normal_request(stack: LocalStack, token: str,
                                                           public_channel: str) -> None:
    # the big box read once, so that the unread responses below come from the cache at once: what
    # is timed is waiting behind stalled clients, not behind six 16 MiB reads of a loaded machine
    assert requests.get(public_channel, headers={"Accept": "application/octet-stream"}, timeout=30).ok
    held = _stall(stack, public_channel)
    try:
        time.sleep(0.5)  # the unread responses are under way
        for _ in range(5):
            started = time.monotonic()
            r = requests.get(f"{stack.url}/v1/collection/", headers={"Authorization": f"Token {token}"}, timeout=10)
            assert r.status_code == 200 and "slow" in r.json()["collections"]
            assert time.monotonic() - started < SERVED_WITHIN_S, "a normal request waited behind stalled clients"
        started = time.monotonic()
        r = requests.get(public_channel.replace("0:512/0:512/0:64", "0:64/0:64/0:8"),
                         headers={"Accept": "application/octet-stream"}, timeout=10)
        assert r.status_code == 200 and len(r.content) == 64 * 64 * 8
        assert time.monotonic() - started < SERVED_WITHIN_S
    finally:
        for s in held:
            s.close()


def test_the_front_drops_a_client_that_stalls(stack: LocalStack, token: str, public_channel: str) -> None:
    """A request line, headers or body that stop arriving are cut off after the front's timeout;
    a stalled body (of a caller allowed to send it: an anonymous one is refused unread) never
    reaches the service, so nothing is written."""
    path = public_channel.split(str(stack.port), 1)[1]
    line = _connect(stack)
    line.sendall(b"GET /v1/collection/ HT")
    body = _connect(stack)
    body.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
                 f"Authorization: Token {token}\r\n"
                 f"Content-Length: {512 * 512 * 64}\r\n\r\n".encode() + b"\1" * 1000)
    started = time.monotonic()
    for s in (line, body):
        s.settimeout(HEADER_TIMEOUT_S + BODY_TIMEOUT_S + 5)
        try:
            answer = s.recv(4096)  # a 408 or a closed connection
        except ConnectionResetError:
            answer = b""
        assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:80]
        s.close()
    assert time.monotonic() - started < HEADER_TIMEOUT_S + BODY_TIMEOUT_S + 3
    r = requests.get(public_channel, headers={"Accept": "application/octet-stream"}, timeout=30)
    assert r.status_code == 200 and not any(r.content[:1000])  # the 1000 bytes sent were not written


def test_one_client_cannot_hold_unbounded_requests(stack: LocalStack, token: str, public_channel: str) -> None:
    """Past its limit of requests in progress, a client gets 503 from the front at once; when it
    lets go, it is served again."""
    path = public_channel.split(str(stack.port), 1)[1]
    held = []
    try:
        for _ in range(CONNECTIONS_PER_CLIENT + 12):
            s = _connect(stack)
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
                      f"Authorization: Token {token}\r\n"
                      f"Content-Length: {512 * 512 * 64}\r\n\r\n".encode())
            held.append(s)
        answers = [b""] * len(held)
        until = time.monotonic() + 0.6 * BODY_TIMEOUT_S  # the ones let in are still waiting for their bodies
        while time.monotonic() < until and sum(a.startswith(b"HTTP/1.1 503") for a in answers) < 12:
            time.sleep(0.05)  # a loaded host answers the last refusals later than the first
            for i, s in enumerate(held):
                if answers[i]:
                    continue
                s.settimeout(0.01)
                try:
                    answers[i] = s.recv(64)
                except TimeoutError:
                    pass
        refused = sum(a.startswith(b"HTTP/1.1 503") for a in answers)
        assert refused == 12 and answers[:CONNECTIONS_PER_CLIENT - 2].count(b"") == CONNECTIONS_PER_CLIENT - 2
    finally:
        for s in held:
            s.close()
    time.sleep(0.2)
    r = requests.get(f"{stack.url}/v1/collection/", headers={"Authorization": f"Token {token}"}, timeout=10)
    assert r.status_code == 200


def test_ranges_head_and_etags_pass_the_front_unchanged(stack: LocalStack, public_channel: str) -> None:
    """What browser_http answers reaches the client through nginx: 206 with only the range's
    bytes, HEAD with the whole length and no body, 304 for a matching ETag."""
    raw = {"Accept": "application/octet-stream"}
    whole = requests.get(public_channel, headers=raw, timeout=30)
    assert whole.status_code == 200 and len(whole.content) == 512 * 512 * 64
    part = requests.get(public_channel, headers={**raw, "Range": "bytes=1000-1999"}, timeout=30)
    assert part.status_code == 206 and part.content == whole.content[1000:2000]
    assert part.headers["Content-Range"] == f"bytes 1000-1999/{len(whole.content)}"
    head = requests.head(public_channel, headers=raw, timeout=30)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["Content-Length"] == str(len(whole.content)) and head.headers["ETag"] == whole.headers["ETag"]
    again = requests.get(public_channel, headers={**raw, "If-None-Match": whole.headers["ETag"]}, timeout=30)
    assert again.status_code == 304 and again.content == b""
    latest = requests.get(public_channel.replace("/v1/", "/latest/", 1), headers={**raw, "Range": "bytes=0-9"},
                          timeout=30)
    assert latest.status_code == 206 and latest.content == whole.content[:10]
