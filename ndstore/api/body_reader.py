"""A request body of known length read into one buffer, past gunicorn's copies.

gunicorn's ``wsgi.input`` (gunicorn.http.body.Body over a LengthReader) passes a body through two
BytesIO buffers a step at a time: each byte is copied about six times before the view has it
(the cache write profile: a quarter of the web worker's Python time in Body.read and
Unreader.read). A body whose length the request declared is instead received straight into one
buffer (socket.recv_into), starting with what gunicorn has already read off the socket, and
gunicorn's reader is told it is consumed, so the drain after the response (ndstore.api.wsgi) and
the connection's next request find the stream where gunicorn expects it.

Anything else -- another WSGI server, Django's test client, a chunked body, a body someone has
started reading -- is read by its stream as before (``None`` here). Errors leave gunicorn's body
marked failed, as its own reads do, so the connection is not reused.
"""

from __future__ import annotations

from typing import Any

from gunicorn.http.body import Body, LengthReader
from gunicorn.http.unreader import SocketUnreader

RECV_STEP = 1 << 20  # one recv_into at most this much (gunicorn's own largest body read)


def read_declared_body(request: Any) -> bytearray | None:
    """The whole body of ``request`` (a Django or DRF request) when gunicorn holds it unread
    behind a Content-Length; None when the stream must be read the ordinary way."""
    django_request = getattr(request, "_request", request)
    if getattr(django_request, "_read_started", True):
        return None  # Django (or a parser) has read from it: its position is not ours to move
    body = django_request.META.get("wsgi.input")
    if type(body) is not Body or body.buf.tell():
        return None
    reader = body.reader
    if type(reader) is not LengthReader or type(reader.unreader) is not SocketUnreader:
        return None
    declared = int(django_request.META.get("CONTENT_LENGTH") or 0)
    if declared <= 0 or reader.length != declared:
        return None
    django_request._read_started = True  # what Django's own read() records
    try:
        return _receive(reader, declared)
    except BaseException:
        body.failed = True
        raise


def _receive(reader: LengthReader, length: int) -> bytearray:
    out = bytearray(length)
    view = memoryview(out)
    held = reader.unreader.take_buffered()  # read off the socket with the headers
    got = min(len(held), length)
    view[:got] = held[:got]
    if len(held) > got:
        reader.unreader.unread(held[got:])  # a pipelined next request: gunicorn's to read
    sock = reader.unreader.sock
    while got < length:
        n = sock.recv_into(view[got:], min(length - got, RECV_STEP))
        if n == 0:
            break  # the peer closed early: a short body, as gunicorn's read would return
        got += n
    reader.length -= got
    del view
    if got < length:
        del out[got:]
    return out
