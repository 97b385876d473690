"""What the hot paths look up in the metadata database on every request — a token's user, a
channel's path, a user's access level on it — kept per process while the metadata generation
(storage/generation.py) they were read under is current, and never longer than MAX_AGE_S.

Every save or delete of a resource, grant, token or user advances the generation (signals.py:
at once, and again when its transaction commits, so a worker that re-read the old rows in
between drops them too). A change made behind Django's back (raw SQL) is seen within MAX_AGE_S.
Without the generation's Redis, lookups go to the database every time."""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from django.http import HttpRequest, HttpResponse

from ndstore.core.errors import StorageError
from ndstore.wiring import metadata_generation

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_AGE_S = 10.0
MAX_ENTRIES = 10_000

_entries: dict[Hashable, tuple[int, float, Any]] = {}
_guard = threading.Lock()
# The generation read by the request being served (one Redis GET per request, not per lookup):
# a request that starts after a change committed reads the generation it advanced to.
# Outside a request (commands, daemons) every lookup reads it afresh.
OUTSIDE, UNREAD = -1, -2
_request_generation: contextvars.ContextVar[int] = contextvars.ContextVar("ndmeta_generation", default=OUTSIDE)


class RequestGeneration:
    """Middleware: lookups of one request share the generation it read first."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        token = _request_generation.set(UNREAD)
        try:
            return self.get_response(request)
        finally:
            _request_generation.reset(token)


def _generation() -> int:
    memo = _request_generation.get()
    if memo >= 0:
        return memo
    generation = metadata_generation().current()
    if memo == UNREAD:
        _request_generation.set(generation)
    return generation


def forget_request_generation() -> None:
    """After a change made by this request: its later lookups read the advanced generation."""
    if _request_generation.get() != OUTSIDE:
        _request_generation.set(UNREAD)


def cached(key: Hashable, load: Callable[[], T], clock: Callable[[], float] = time.monotonic) -> T:
    """``load()``, or what it returned before under the current generation. Exceptions (a
    resource that does not exist) are not cached."""
    try:
        generation = _generation()
    except StorageError as exc:
        log.warning("metadata cache bypassed: %s", exc)
        return load()
    now = clock()
    with _guard:
        hit = _entries.get(key)
    if hit is not None and hit[0] == generation and now - hit[1] < MAX_AGE_S:
        return hit[2]  # type: ignore[no-any-return]
    value = load()
    with _guard:
        if len(_entries) >= MAX_ENTRIES:
            _entries.clear()
        _entries[key] = (generation, now, value)
    return value


def clear() -> None:
    with _guard:
        _entries.clear()
