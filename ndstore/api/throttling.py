"""Per-caller limits on reads, counted across every web worker and node (storage/rate_limit.py).

- Anonymous GETs per client address (NDSTORE_ANON_READ_RATE, e.g. `3000/min`; `0` turns it
  off). Authenticated requests are not counted here: their tokens are accountable, and
  pipelines read hard.
- The bytes a caller's data GETs read (NDSTORE_ANON_READ_BYTES_PER_S and _BURST per client
  address, NDSTORE_READ_BYTES_PER_S and _BURST per user): a data GET is charged, before it reads
  anything, the bytes it reads to make its whole answer (budget.reserve), whether it is answered
  whole, as a Range of one byte, as a 304 or to a HEAD; a caller whose budget is spent gets 429
  with Retry-After. So no caller makes the service read more than its rate, after a burst, plus
  one request (the last one admitted may take the bucket below empty).

Behind proxies, NDSTORE_NUM_PROXIES says how many X-Forwarded-For hops to trust. If the
counters' Redis is down, reads are not limited (logged)."""

from __future__ import annotations

import logging
import math
from typing import Any

from rest_framework.throttling import BaseThrottle

from ndstore.core.errors import ReadBudgetSpent, StorageError
from ndstore.wiring import services

log = logging.getLogger(__name__)
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


class AnonymousReadThrottle(BaseThrottle):
    def __init__(self) -> None:
        self.retry_after: float | None = None

    def allow_request(self, request: Any, view: Any) -> bool:
        if request.method not in SAFE_METHODS or request.user.is_authenticated:
            return True
        rate = services().config.anon_read_limit
        if rate is None:
            return True
        try:
            wait = services().rate_limiter.hit(f"anon:{self.get_ident(request)}", *rate)
        except StorageError as exc:
            # the counters' Redis being down must not take reads down with it
            log.warning("anonymous reads are not rate limited now: %s", exc)
            return True
        self.retry_after = wait or None
        return not wait

    def wait(self) -> float | None:
        return self.retry_after


def spend_read(request: Any, nbytes: int, anonymous: bool) -> None:
    """Charge the ``nbytes`` a data GET is about to read to its caller's read budget: anonymous
    callers by client address (where the anonymous request rate takes it), others by user.
    Raises ReadBudgetSpent (429) when the budget is spent; nothing is charged then."""
    budget = services().config.read_budget(anonymous)
    if budget is None or nbytes <= 0:
        return
    who = f"anon:{BaseThrottle().get_ident(request)}" if anonymous else f"user:{request.user.pk}"
    try:
        wait = services().rate_limiter.spend(who, nbytes, *budget)
    except StorageError as exc:
        log.warning("data reads are not budgeted now: %s", exc)
        return
    if wait:
        raise ReadBudgetSpent(_spent(anonymous, *budget, math.ceil(wait)), math.ceil(wait))


def _spent(anonymous: bool, per_s: int, burst: int, wait_s: int) -> str:
    who, setting = ("this address", "NDSTORE_ANON_READ_BYTES") if anonymous else ("this user", "NDSTORE_READ_BYTES")
    return (f"{who} has read as many bytes as it may for now: data GETs may read {per_s} bytes a second after a "
            f"burst of {burst} ({setting}_PER_S, {setting}_BURST), each counted in the bytes it reads to make its "
            f"whole answer, whatever part of it a Range asks for; retry in {wait_s} s"
            + (", or authenticate with a token" if anonymous else ""))
