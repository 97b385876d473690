"""Rate limit of anonymous reads (NDSTORE_ANON_READ_RATE, e.g. `3000/min`; `0` turns it off),
counted per client address across every web worker and node (storage/rate_limit.py).
Authenticated requests are not limited here: their tokens are accountable, and pipelines read
hard. Behind proxies, NDSTORE_NUM_PROXIES says how many X-Forwarded-For hops to trust."""

from __future__ import annotations

import logging
from typing import Any

from rest_framework.throttling import BaseThrottle

from ndstore.core.errors import StorageError
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
