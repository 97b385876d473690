"""Bytes in flight per web worker: no client, and no crowd of anonymous ones, can make a worker
hold more memory than it may.

A data request (cutout, ids, slice image, precomputed or zarr chunk) reserves what it will hold
once it is authenticated and its box is validated, before it reads anything: its array (a read
2 x: the array and its encoded answer; a write 4 x: the body as read, its decoded array, the
merged and compressed cuboids, the commands that store them) plus the supercuboids it holds whole
at once, counted at their raw size (what an incompressible stored object is). A read fetches and
decodes at most two read windows of stored objects (NDSTORE_READ_WINDOW_BYTES, at least one
supercuboid each) and never more than it touches; a write stores a window of supercuboids at once,
each a partly covered one read whole, its stored object and its new one (3 x). So a thin box over
many supercuboids costs what it holds, not what its array is (docs/design/serving.md, "Budgets").
A worker process has NDSTORE_WORKER_BYTES_IN_FLIGHT (default: room for the largest write,
4 x NDSTORE_MAX_CUTOUT_BYTES + 3 read windows); anonymous requests share
NDSTORE_ANON_BYTES_IN_FLIGHT of it (512 MiB), which is also the most one of them may cost.
Beyond its budget a request is refused at once with 503 and Retry-After (another worker or a
moment later may have room); a request that could never fit is 413. The reservation ends when
the response has been handed to the front (Django's request_finished, sent by the WSGI server in
the request's own thread when it closes the response). Beyond the budget a worker holds at most
one read window of objects whose page-ins finish after their reads (or writes) answered (the
cache tier's own bound, docs/design/cache-tier.md).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from django.core.signals import request_finished, request_started

from ndstore.api import throttling
from ndstore.core.errors import Busy, PayloadTooLarge
from ndstore.core.geometry import CUBOID_BYTES, CUBOIDS_PER_SUPERCUBOID
from ndstore.wiring import services

if TYPE_CHECKING:
    from ndstore.engine.volume import Cutout

READ_FACTOR, WRITE_FACTOR = 2, 4  # bytes held per byte of the request's array
READ_WINDOWS, WRITE_BLOBS = 2, 3  # a read: windows of objects; a write: a window, 3 x each supercuboid
SUPERCUBOID_BYTES = CUBOID_BYTES * CUBOIDS_PER_SUPERCUBOID[0] * CUBOIDS_PER_SUPERCUBOID[1] * CUBOIDS_PER_SUPERCUBOID[2]


class ByteBudget:
    def __init__(self, total: int, anonymous: int):
        self.total, self.anonymous = total, min(anonymous, total)
        self._held = self._held_anonymous = 0
        self._guard = threading.Lock()

    def take(self, cost: int, anonymous: bool) -> None:
        limit = self.anonymous if anonymous else self.total
        if cost > limit:
            who = "an anonymous request" if anonymous else "a request"
            hint = "; send a token, or ask for a smaller box" if anonymous else "; ask for a smaller box"
            raise PayloadTooLarge(f"{who} may hold at most {limit} bytes in a web worker and this one needs {cost} "
                                  f"(a read holds {READ_FACTOR} x its array, a write {WRITE_FACTOR} x, "
                                  f"each plus the supercuboids it holds whole at once){hint}")
        with self._guard:
            if self._held + cost > self.total or (anonymous and self._held_anonymous + cost > self.anonymous):
                share = f"; anonymous: {self._held_anonymous} of {self.anonymous}" if anonymous else ""
                raise Busy(f"this web worker holds as many bytes of other requests as it may ({self._held} of "
                           f"{self.total}{share}); retry shortly")
            self._held += cost
            if anonymous:
                self._held_anonymous += cost

    def give(self, cost: int, anonymous: bool) -> None:
        with self._guard:
            self._held -= cost
            if anonymous:
                self._held_anonymous -= cost

    @property
    def held(self) -> int:
        return self._held


_budget: ByteBudget | None = None
_budget_guard = threading.Lock()
_requests = threading.local()


def worker_budget() -> ByteBudget:
    global _budget
    if _budget is None:
        with _budget_guard:
            if _budget is None:
                config = services().config
                largest_write = (WRITE_FACTOR * config.max_cutout_bytes
                                 + WRITE_BLOBS * max(config.read_window_bytes, SUPERCUBOID_BYTES))
                total = config.worker_bytes_in_flight or largest_write
                _budget = ByteBudget(total, config.anon_bytes_in_flight)
    return _budget


def cost(reading: bool, array_bytes: int, cutout: Cutout | None, window_bytes: int) -> int:
    """What a read (or write) of an array of `array_bytes` over `cutout`'s supercuboids holds
    with a read window of `window_bytes` (cutout None: no supercuboids, e.g. what a request holds
    besides a read it has reserved already)."""
    if cutout is None:
        return (READ_FACTOR if reading else WRITE_FACTOR) * array_bytes
    grid, itemsize = cutout.channel.grid(cutout.resolution), cutout.channel.dtype.itemsize
    whole, window = grid.supercuboid_bytes(itemsize), grid.window(window_bytes, itemsize)
    if reading:
        return READ_FACTOR * array_bytes + min(cutout.supercuboids, READ_WINDOWS * window) * whole
    return WRITE_FACTOR * array_bytes + WRITE_BLOBS * min(cutout.supercuboids, window) * whole


def reads(request: Any) -> bool:
    """Whether the request reads (and is budgeted as a read) or writes."""
    return request.method in ("GET", "HEAD")


def reserve(request: Any, array_bytes: int, cutout: Cutout | None, *, reading: int) -> None:
    """Reserve what this request will hold for an array of `array_bytes` over `cutout`'s
    supercuboids (by its method: a read or a write), until its response is closed; raises Busy
    (503) or PayloadTooLarge (413). A GET or HEAD is then charged `reading`, the bytes it reads to
    make its whole answer, to its caller's read budget (throttling.spend_read; 429 when spent)."""
    anonymous = not getattr(request, "user", None) or not request.user.is_authenticated
    needed = cost(reads(request), array_bytes, cutout, services().config.read_window_bytes)
    worker_budget().take(needed, anonymous)
    held = getattr(_requests, "held", None)
    if held is None:
        held = _requests.held = []
    held.append((needed, anonymous))  # given back when the request ends, whatever happens next
    if reads(request):
        throttling.spend_read(request, reading, anonymous)


def release(**_: Any) -> None:
    """Give back what this thread's request reserved."""
    held = getattr(_requests, "held", None)
    if held and _budget is not None:
        for cost, anonymous in held:
            _budget.give(cost, anonymous)
    _requests.held = []


request_finished.connect(release, dispatch_uid="ndstore-budget-release")
request_started.connect(release, dispatch_uid="ndstore-budget-release-stale")
