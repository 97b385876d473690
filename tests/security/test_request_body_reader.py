"""A request body read straight off gunicorn's socket (ndstore/api/body_reader.py) is read to its
declared length and not a byte further, whatever the sender does: the bytes after it (a pipelined
next request, or an attempt to smuggle one) stay for gunicorn; a body cut short is refused and
stores nothing; a stalled one leaves the connection marked unusable. Driven through the whole
Django stack with gunicorn's own Body, LengthReader and SocketUnreader over a socket pair."""

from __future__ import annotations

import io
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import blosc
import numpy as np
import pytest
from gunicorn.http.body import Body, LengthReader
from gunicorn.http.unreader import SocketUnreader

from ndstore.api import media
from ndstore.api.body_reader import read_declared_body
from ndstore.api.wsgi import application
from tests.api.conftest import Dataset
from tests.security.conftest import token_for, wsgi

SHAPE = (8, 512, 512)  # z, y, x: 2 MiB of uint8
NEXT_REQUEST = b"GET /v1/info/ HTTP/1.1\r\nHost: x\r\n\r\n"


@dataclass
class Wire:
    """gunicorn's view of one connection: what it read with the headers is in the unreader."""

    body: Body
    unreader: SocketUnreader
    peer: socket.socket
    sender: threading.Thread

    def left_for_gunicorn(self) -> bytes:
        """What gunicorn would read next on this connection (the peer has stopped sending)."""
        self.sender.join(10)
        self.peer.shutdown(socket.SHUT_WR)
        rest = self.unreader.take_buffered()
        while chunk := self.unreader.sock.recv(1 << 16):
            rest += chunk
        return rest


@pytest.fixture
def wires() -> Iterator[list[Wire]]:
    made: list[Wire] = []
    yield made
    for w in made:
        w.sender.join(5)
        w.peer.close()
        w.unreader.sock.close()


def connection(wires: list[Wire], with_headers: bytes, then: bytes, declared: int, close: bool = False,
               timeout: float | None = None) -> Wire:
    """A connection whose first ``with_headers`` bytes of body came in with the headers and
    ``then`` follows on the socket; ``close``: the sender hangs up after it."""
    ours, peer = socket.socketpair()
    ours.settimeout(timeout)
    unreader = SocketUnreader(ours)
    unreader.unread(with_headers)

    def send() -> None:
        peer.sendall(then)
        if close:
            peer.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    wire = Wire(Body(LengthReader(unreader, declared)), unreader, peer, sender)
    wires.append(wire)
    return wire


def volume() -> np.ndarray:
    return (np.arange(np.prod(SHAPE), dtype=np.uint64) * 2654435761 % 251).astype(np.uint8).reshape(SHAPE)


def stored(token: str, dataset: Dataset) -> np.ndarray:
    answer = wsgi("GET", dataset.cutout("img8", 0, (0, 512), (0, 512), (0, 8)), token=token,
                  extra={"HTTP_ACCEPT": "application/octet-stream"})
    assert answer.status == 200, answer.body[:200]
    return np.frombuffer(answer.body, np.uint8).reshape(SHAPE)


def write(wire: Wire, declared: int, token: str, dataset: Dataset) -> tuple[int, bytes]:
    answer = wsgi("POST", dataset.cutout("img8", 0, (0, 512), (0, 512), (0, 8)), token=token,
                  content_type="application/blosc", app=application, stream=wire.body, length=declared)
    return answer.status, answer.body


@pytest.mark.django_db
def test_a_body_is_read_to_its_declared_end_and_the_next_request_stays_for_gunicorn(
        dataset: Dataset, wires: list[Wire], monkeypatch: pytest.MonkeyPatch) -> None:
    _, token = token_for("writer", is_staff=True, is_superuser=True)
    taken: list[object] = []
    monkeypatch.setattr(media, "read_declared_body", lambda r: taken.append(read_declared_body(r)) or taken[-1])
    data = volume()
    body = blosc.compress(data.tobytes(), typesize=1)
    wire = connection(wires, body[:1000], body[1000:] + NEXT_REQUEST, len(body))
    status, answer = write(wire, len(body), token, dataset)
    assert status == 201, answer[:200]
    assert wire.body.reader.length == 0 and not wire.body.failed
    assert [type(t) for t in taken] == [bytearray]  # taken over, not read through gunicorn's buffers
    assert wire.left_for_gunicorn() == NEXT_REQUEST  # not a byte of it taken as body
    assert np.array_equal(stored(token, dataset), data)


@pytest.mark.django_db
def test_a_smuggled_request_that_came_in_with_the_headers_is_not_read_as_body(dataset: Dataset,
                                                                                wires: list[Wire]) -> None:
    _, token = token_for("writer", is_staff=True, is_superuser=True)
    data = volume()
    body = blosc.compress(data.tobytes(), typesize=1)
    wire = connection(wires, body + NEXT_REQUEST, b"", len(body))  # all of it read with the headers
    status, _ = write(wire, len(body), token, dataset)
    assert status == 201
    assert wire.left_for_gunicorn() == NEXT_REQUEST
    assert np.array_equal(stored(token, dataset), data)


@pytest.mark.django_db
def test_a_body_cut_short_of_its_declared_length_is_refused_and_stores_nothing(dataset: Dataset,
                                                                               wires: list[Wire]) -> None:
    _, token = token_for("writer", is_staff=True, is_superuser=True)
    body = blosc.compress(volume().tobytes(), typesize=1)
    wire = connection(wires, body[:500], body[500:len(body) // 2], len(body), close=True)
    status, answer = write(wire, len(body), token, dataset)
    assert status == 400 and b"body" in answer, answer[:300]
    assert not stored(token, dataset).any()


def test_a_stalled_body_raises_and_leaves_the_connection_marked_unusable(wires: list[Wire]) -> None:
    request = FakeDjangoRequest(wire := connection(wires, b"x" * 10, b"y" * 100, 4096, timeout=0.2), 4096)
    with pytest.raises(TimeoutError):
        read_declared_body(request)
    assert wire.body.failed  # gunicorn closes it rather than read a next request from mid-body


def test_only_an_unread_gunicorn_body_of_declared_length_is_taken_over(wires: list[Wire]) -> None:
    wire = connection(wires, b"abcd", b"efgh", 8)
    assert read_declared_body(FakeDjangoRequest(io.BytesIO(b"abcdefgh"), 8)) is None  # another server's input
    assert read_declared_body(FakeDjangoRequest(wire, 7)) is None  # a length that is not the reader's
    started = FakeDjangoRequest(wire, 8)
    started._read_started = True
    assert read_declared_body(started) is None  # someone has read from it
    wire.body.read(1)
    assert read_declared_body(FakeDjangoRequest(wire, 8)) is None  # its own buffer holds read-ahead
    assert read_declared_body(FakeDjangoRequest(connection(wires, b"", b"", 0), 0)) is None  # no body


def test_the_body_taken_over_is_the_declared_bytes(wires: list[Wire]) -> None:
    wire = connection(wires, b"abcd", b"efgh" + NEXT_REQUEST, 8)
    request = FakeDjangoRequest(wire, 8)
    assert read_declared_body(request) == bytearray(b"abcdefgh")
    assert request._read_started  # as Django's own read records it
    assert wire.body.read() == b""  # what the drain after the answer then finds
    assert wire.left_for_gunicorn() == NEXT_REQUEST


class FakeDjangoRequest:
    """What read_declared_body looks at of a Django request: META and whether reading began."""

    def __init__(self, source: Wire | io.BytesIO, declared: int):
        stream = source.body if isinstance(source, Wire) else source
        self.META = {"wsgi.input": stream, "CONTENT_LENGTH": str(declared)}
        self._read_started = False
