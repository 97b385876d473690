"""What a request holds in a web worker while the data plane serves it, and the budget it holds
it against: no client, and no crowd of anonymous ones, can make a worker hold more memory than
it may. Owned by the data plane, next to the code that allocates (docs/design/serving.md).

A read holds 2 x its array (the array and its encoded answer); a write 4 x (the body as read, its
decoded array, the merged and compressed cuboids, the commands that store them). Each also holds
the supercuboids it fetches whole at once, counted at their raw size (what an incompressible
stored object is): a read fetches and decodes at most two read windows of stored objects
(NDSTORE_READ_WINDOW_BYTES, at least one supercuboid each) and never more than it touches; a
write stores a window of supercuboids at once, each a partly covered one read whole, its stored
object and its new one (3 x). So a thin box over many supercuboids costs what it holds, not what
its array is.

A worker has NDSTORE_WORKER_BYTES_IN_FLIGHT (default: room for the largest write, 4 x
NDSTORE_MAX_CUTOUT_BYTES + 3 read windows); anonymous requests share NDSTORE_ANON_BYTES_IN_FLIGHT
of it, which is also the most one of them may cost. Beyond its budget a request is refused at
once with Busy (503; another worker or a moment later may have room); one that could never fit is
PayloadTooLarge (413).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ndstore.core.errors import Busy, PayloadTooLarge
from ndstore.core.geometry import CUBOID_BYTES, CUBOIDS_PER_SUPERCUBOID
from ndstore.engine.volume import Cutout

READ_FACTOR, WRITE_FACTOR = 2, 4  # bytes held per byte of the request's array
READ_WINDOWS, WRITE_BLOBS = 2, 3  # a read: windows of objects; a write: a window, 3 x each supercuboid
SUPERCUBOID_BYTES = CUBOID_BYTES * CUBOIDS_PER_SUPERCUBOID[0] * CUBOIDS_PER_SUPERCUBOID[1] * CUBOIDS_PER_SUPERCUBOID[2]


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


def largest_write(max_cutout_bytes: int, window_bytes: int) -> int:
    """What the largest write a worker accepts holds: the default size of a worker's budget."""
    return WRITE_FACTOR * max_cutout_bytes + WRITE_BLOBS * max(window_bytes, SUPERCUBOID_BYTES)


@dataclass(frozen=True)
class Reservation:
    """Bytes taken from a ByteBudget; `release()` gives them back (once)."""

    budget: ByteBudget
    nbytes: int
    anonymous: bool

    def release(self) -> None:
        self.budget.give(self.nbytes, self.anonymous)


class ByteBudget:
    def __init__(self, total: int, anonymous: int):
        self.total, self.anonymous = total, min(anonymous, total)
        self._held = self._held_anonymous = 0
        self._guard = threading.Lock()

    def take(self, nbytes: int, anonymous: bool) -> Reservation:
        limit = self.anonymous if anonymous else self.total
        if nbytes > limit:
            who = "an anonymous request" if anonymous else "a request"
            hint = "; send a token, or ask for a smaller box" if anonymous else "; ask for a smaller box"
            raise PayloadTooLarge(f"{who} may hold at most {limit} bytes in a web worker and this one needs {nbytes} "
                                  f"(a read holds {READ_FACTOR} x its array, a write {WRITE_FACTOR} x, "
                                  f"each plus the supercuboids it holds whole at once){hint}")
        with self._guard:
            if self._held + nbytes > self.total or (anonymous and self._held_anonymous + nbytes > self.anonymous):
                share = f"; anonymous: {self._held_anonymous} of {self.anonymous}" if anonymous else ""
                raise Busy(f"this web worker holds as many bytes of other requests as it may ({self._held} of "
                           f"{self.total}{share}); retry shortly")
            self._held += nbytes
            if anonymous:
                self._held_anonymous += nbytes
        return Reservation(self, nbytes, anonymous)

    def give(self, nbytes: int, anonymous: bool) -> None:
        with self._guard:
            self._held -= nbytes
            if anonymous:
                self._held_anonymous -= nbytes

    @property
    def held(self) -> int:
        return self._held
