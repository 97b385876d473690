"""Fixed-window request counters on Redis, shared by every web worker and node.

  ndrl:{KEY}:{WINDOW}   integer: requests of KEY in that window; expires with the window
One INCR and one PEXPIRE in a single round trip; the window number is part of the key, so no
reset is ever needed and a counter outlives its window by at most the expiry.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis

from ndstore.core.errors import StorageError


class RedisRateLimiter:
    def __init__(self, client: redis.Redis, clock: Callable[[], float] = time.time):
        self._redis = client
        self._clock = clock

    def hit(self, key: str, limit: int, window_s: float) -> float:
        """Count one request of ``key``; 0 when it is within ``limit`` per window, else the
        seconds until the window ends."""
        now = self._clock()
        window = int(now // window_s)
        name = f"ndrl:{{{key}}}:{window}"
        pipe = self._redis.pipeline(transaction=False)
        pipe.incr(name)
        pipe.pexpire(name, int(window_s * 1000) + 1000)
        try:
            count, _ = pipe.execute()
        except redis.RedisError as exc:
            raise StorageError(f"rate-limit counters unavailable: {exc}") from exc
        return 0.0 if int(count) <= limit else (window + 1) * window_s - now
