"""The background daemons of the cache tier: the write-back flusher and the cache manager.

Flusher: every `interval_s`, supercuboids dirty for longer than `age_s` are written back,
at most `max_in_flight` at once. The cache manager: when Redis uses more than the high
watermark, it evicts least-recently-used whole supercuboids (flushing dirty ones first) until
usage is below the low watermark; it takes each lock with a short timeout and skips busy
supercuboids, so foreground reads and writes are never stalled behind it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ndstore.core.errors import LockTimeout, StorageError
from ndstore.engine.cache_tier import CacheTier

log = logging.getLogger(__name__)


def _rounds(run_once: Callable[[], object], interval_s: float, stop: threading.Event, what: str) -> None:
    """``run_once`` every ``interval_s`` until ``stop``; a round that meets a storage error is
    skipped (Redis away: restarting, loading its AOF) and the next one retries."""
    while not stop.wait(interval_s):
        try:
            run_once()
        except StorageError as exc:
            log.warning("%s round skipped: %s", what, exc)


@dataclass
class Flusher:
    tier: CacheTier
    age_s: float = 5.0
    interval_s: float = 1.0
    max_in_flight: int = 4
    _pool: ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        self._pool = ThreadPoolExecutor(self.max_in_flight, thread_name_prefix="flusher")

    def run_once(self, age_s: float | None = None) -> int:
        names = self.tier.due_for_write_back(self.age_s if age_s is None else age_s, self.max_in_flight * 8)
        return sum(self._pool.map(self._flush_one, names))

    def _flush_one(self, name: str) -> int:
        try:
            return self.tier.flush([name])
        except (LockTimeout, StorageError) as exc:
            log.warning("flush of %s postponed: %s", name, exc)
            return 0

    def run(self, stop: threading.Event) -> None:
        _rounds(self.run_once, self.interval_s, stop, "write-back")


@dataclass
class CacheManager:
    tier: CacheTier
    high_bytes: int
    low_bytes: int
    interval_s: float = 1.0
    batch: int = 16
    lock_timeout_s: float = 0.2

    def run_once(self) -> int:
        if self.tier.memory_used() <= self.high_bytes:
            return 0
        evicted = 0
        while self.tier.memory_used() > self.low_bytes:
            names = self.tier.coldest(self.batch)
            done = sum(self._evict(n) for n in names)
            if done == 0:
                break  # everything cold is busy right now; try again next round
            evicted += done
        return evicted

    def _evict(self, name: str) -> int:
        try:
            return int(self.tier.evict(name, self.lock_timeout_s))
        except (LockTimeout, StorageError) as exc:
            log.info("eviction of %s skipped: %s", name, exc)
        return 0

    def run(self, stop: threading.Event) -> None:
        _rounds(self.run_once, self.interval_s, stop, "eviction")
