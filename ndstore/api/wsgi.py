"""WSGI entry point for gunicorn: Django's handler, and the rest of each request body read and
discarded once its response is closed.

Why the drain: the front (nginx, ndstore/ops/front.py) has a request's whole body before it
forwards it, and writes it to gunicorn while gunicorn answers. A request refused before its body
is read (a budget 503, a 401/403/404/413) leaves up to the whole body unread; gunicorn drains at
most 64 KiB of it and closes the connection, and nginx, still writing, may then answer the client
502 "Bad Gateway" in place of the refusal (a race: it depends on whether nginx read the answer
before its write failed). Reading the rest after the response has been written lets nginx finish
and relay the refusal. Nothing is parsed or kept (one reused buffer), the body comes from the
front at local speed and is at most NDSTORE_MAX_BODY_BYTES, and the read is bounded in time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ndstore.api.settings.base")

DRAIN_CHUNK = 1 << 20
DRAIN_SECONDS = 10.0  # past this the connection closes as it would have without the drain


def drain(environ: dict[str, Any], seconds: float = DRAIN_SECONDS) -> int:
    """Read and discard what is left of the request body; the bytes read."""
    stream = environ.get("wsgi.input")
    sock = environ.get("gunicorn.socket")
    if stream is None:
        return 0
    deadline = time.monotonic() + seconds
    prior = sock.gettimeout() if sock is not None else None
    read = 0
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if sock is not None:
                sock.settimeout(remaining)
            piece = stream.read(DRAIN_CHUNK)
            if not piece:
                break
            read += len(piece)
    except OSError:
        pass  # a timeout or a peer gone: the connection closes, as before
    finally:
        if sock is not None:
            sock.settimeout(prior)
    return read


def _has_body(environ: dict[str, Any]) -> bool:
    length = str(environ.get("CONTENT_LENGTH") or "").strip()
    return length not in ("", "0") or "chunked" in str(environ.get("HTTP_TRANSFER_ENCODING", "")).lower()


class _Drained:
    """The response iterable, which drains the request body after closing."""

    def __init__(self, response: Iterable[bytes], environ: dict[str, Any]):
        self._response, self._environ = response, environ

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._response)

    def close(self) -> None:
        try:
            getattr(self._response, "close", lambda: None)()
        finally:
            drain(self._environ)


def draining(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """``app``, whose requests with a body have that body read to its end once answered."""

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        response = app(environ, start_response)
        if not _has_body(environ):
            return response  # nothing to drain: the response goes out as it is (file wrappers too)
        return _Drained(response, environ)

    return wrapped


def import_routes() -> None:
    """Import the routes and every view now, as the worker loads the app, not in its first
    request: Django imports the URLconf lazily, and with it DRF, the OpenAPI generator and the
    views, which made the first request a fresh worker served (after a start, a deploy, or the
    replacement of a worker that died) take ~0.5 s instead of ~6 ms (docs/design/serving.md,
    "gunicorn workers"). An import error now stops the worker at its start instead of failing requests."""
    get_resolver().url_patterns  # noqa: B018 - the cached property imports the URLconf


application = draining(get_wsgi_application())
import_routes()
