"""A request's reservation in its web worker's budget of bytes in flight, held from when its box
is validated until its response has been handed to the front.

What a request costs and the budget it is held against are the data plane's
(ndstore/engine/cost.py); this module ties them to a Django request: the caller is anonymous or
not, a GET or HEAD is a read, and the reservation ends with Django's request_finished, sent by the
WSGI server in the request's own thread when it closes the response. Beyond the budget a worker
holds at most one read window of objects whose page-ins finish after their reads (or writes)
answered (the cache tier's own bound, docs/design/cache-tier.md).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from django.core.signals import request_finished, request_started

from ndstore.api import throttling
from ndstore.wiring import services

if TYPE_CHECKING:
    from ndstore.engine.cost import Reservation
    from ndstore.engine.volume import Cutout

_requests = threading.local()


def reads(request: Any) -> bool:
    """Whether the request reads (and is budgeted as a read) or writes."""
    return request.method in ("GET", "HEAD")


def reserve(request: Any, array_bytes: int, cutout: Cutout | None, *, reading: int) -> None:
    """Reserve what this request will hold for an array of `array_bytes` over `cutout`'s
    supercuboids (by its method: a read or a write), until its response is closed; raises Busy
    (503) or PayloadTooLarge (413). A GET or HEAD is then charged `reading`, the bytes it reads to
    make its whole answer, to its caller's read budget (throttling.spend_read; 429 when spent)."""
    anonymous = not getattr(request, "user", None) or not request.user.is_authenticated
    held = services().plane.reserve(array_bytes, cutout, reading=reads(request), anonymous=anonymous)
    reservations: list[Reservation] | None = getattr(_requests, "held", None)
    if reservations is None:
        reservations = _requests.held = []
    reservations.append(held)  # given back when the request ends, whatever happens next
    if reads(request):
        throttling.spend_read(request, reading, anonymous)


def release(**_: Any) -> None:
    """Give back what this thread's request reserved."""
    reservations: list[Reservation] = getattr(_requests, "held", None) or []
    _requests.held = []
    for held in reservations:
        held.release()


request_finished.connect(release, dispatch_uid="ndstore-budget-release")
request_started.connect(release, dispatch_uid="ndstore-budget-release-stale")
