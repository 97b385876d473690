"""Per-caller limits on Redis, shared by every web worker and node.

  ndrl:{KEY}:{WINDOW}   integer: requests of KEY in that window; expires with the window
  ndrb:{KEY}            the time (ms since the epoch) at which KEY's byte bucket is full again;
                        expires then
Requests are counted in fixed windows: one INCR and one PEXPIRE in a single round trip; the
window number is part of the key, so no reset is ever needed and a counter outlives its window by
at most the expiry. Bytes are spent from a bucket that refills at a rate up to a burst, kept as
one number (when the bucket is full again: the generic cell rate algorithm) by one Lua script
that admits and charges in a single atomic step.

Neither is logged (the scripts' effects are not replicated: `REPL_NONE`). The Redis they live in
fsyncs every logged write before it answers (`appendfsync always`), and every data GET spends:
logged, a spend cost 1.7 ms against 0.15 unlogged (one-off, 1,000 each, a Redis with the
service's settings on this host's disk), more than the rest of a chunk's Redis work. A Redis that
restarts or fails over forgets the counts: every caller starts again with a full bucket and an
empty window, a burst's worth at most.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis

from ndstore.core.errors import StorageError

# KEYS[1] the bucket; ARGV now, the cost and the burst, in ms of refill. A caller is admitted while
# its bucket is not empty (what it owes is under the burst) and then charged the whole cost: one
# request may take it below empty, and the next waits until it is above again. Returns the ms to
# wait, 0 when admitted.
_SPEND = """
redis.set_repl(redis.REPL_NONE)
local now, cost, burst = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local full = tonumber(redis.call('GET', KEYS[1]) or '0')
if full < now then full = now end
if full - now >= burst then return math.ceil(full - now - burst) + 1 end
full = full + cost
redis.call('SET', KEYS[1], string.format('%.3f', full), 'PX', math.ceil(full - now) + 1000)
return 0
"""


# KEYS[1] the window's counter; ARGV its expiry in ms. Returns the count, this request included.
_HIT = """
redis.set_repl(redis.REPL_NONE)
local count = redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return count
"""


class RedisRateLimiter:
    def __init__(self, client: redis.Redis, clock: Callable[[], float] = time.time):
        self._redis = client
        self._clock = clock
        self._spend = client.register_script(_SPEND)
        self._hit = client.register_script(_HIT)

    def hit(self, key: str, limit: int, window_s: float) -> float:
        """Count one request of ``key``; 0 when it is within ``limit`` per window, else the
        seconds until the window ends."""
        now = self._clock()
        window = int(now // window_s)
        name = f"ndrl:{{{key}}}:{window}"
        try:
            count = self._hit(keys=[name], args=[int(window_s * 1000) + 1000])
        except redis.RedisError as exc:
            raise StorageError(f"rate-limit counters unavailable: {exc}") from exc
        return 0.0 if int(count) <= limit else (window + 1) * window_s - now

    def spend(self, key: str, nbytes: int, per_s: int, burst: int) -> float:
        """Spend ``nbytes`` from ``key``'s bucket, which refills at ``per_s`` bytes a second up to
        ``burst``: 0 when admitted (and charged, even past empty), else the seconds until the
        bucket is no longer empty (nothing charged)."""
        ms = 1000 / per_s
        try:
            wait = self._spend(keys=[f"ndrb:{{{key}}}"], args=[f"{self._clock() * 1000:.3f}", f"{nbytes * ms:.3f}",
                                                                f"{burst * ms:.3f}"])
        except redis.RedisError as exc:
            raise StorageError(f"read budgets unavailable: {exc}") from exc
        return int(wait) / 1000
