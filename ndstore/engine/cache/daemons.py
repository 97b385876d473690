"""The background daemons of the cache tier: the write-back flusher and the cache manager.

Flusher: every `interval_s`, supercuboids dirty for longer than `age_s` are written back,
at most `max_in_flight` at once, and the ledger of what the cache Redis holds unflushed is
brought up to date (ndstore/engine/ledger.py). The cache manager: when Redis uses more than the high
watermark, it evicts least-recently-used whole supercuboids (flushing dirty ones first) until
usage is below the low watermark; it takes each lock with a short timeout and skips busy
supercuboids, so foreground reads and writes are never stalled behind it.

Both survive any failure: a round that raises is logged and counted
(`ndstore_daemon_errors_total{daemon, kind}`), and the next one comes after a backoff that grows
to 30 s and resets on success, so a daemon resumes by itself once a full or read-only store, or
a Redis that is away, is back.

Each gets the tier's port it needs (ndstore/engine/cache/ports.py): the flusher `WriteBackDaemon`,
the cache manager `EvictionDaemon` (`CacheTier.upkeep` is both; the tier passes them on too).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ndstore.core.errors import LockTimeout, StorageError, StorageFull
from ndstore.core.observe import NULL, Observer
from ndstore.engine.cache.ports import EvictionDaemon, WriteBackDaemon

log = logging.getLogger(__name__)
MAX_BACKOFF_S = 30.0


def rounds(run_once: Callable[[], object], interval_s: float, stop: threading.Event, daemon: str,
           observer: Observer = NULL) -> None:
    """``run_once`` every ``interval_s`` until ``stop``, whatever it raises: a failed round is
    logged and counted, and the next waits a backoff (doubling to MAX_BACKOFF_S, reset by a round
    that succeeds)."""
    wait = interval_s
    while not stop.wait(wait):
        try:
            run_once()
        except Exception as exc:  # a daemon never dies: it reports and tries again
            observer.count("daemon_errors_total", daemon=daemon, kind=type(exc).__name__)
            wait = min(MAX_BACKOFF_S, max(interval_s, wait * 2))
            if isinstance(exc, StorageError):
                log.warning("%s round failed, next try in %.1fs: %s", daemon, wait, exc)
            else:
                log.exception("%s round failed, next try in %.1fs", daemon, wait)
            continue
        observer.count("daemon_rounds_total", daemon=daemon)
        wait = interval_s


@dataclass
class Flusher:
    tier: WriteBackDaemon
    age_s: float = 5.0
    interval_s: float = 1.0
    max_in_flight: int = 4
    observer: Observer = NULL
    _pool: ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        self._pool = ThreadPoolExecutor(self.max_in_flight, thread_name_prefix="flusher")

    def run_once(self, age_s: float | None = None) -> int:
        """One round: the cache Redis checked against its ledger (nothing is written back from a
        Redis that came back short), what is due written back, the ledger brought up to date.
        A round in which every write-back failed on its store (not on a busy lock) raises, so
        that the loop backs off instead of retrying a full or read-only store every second."""
        self.tier.check_ledger()
        names = self.tier.due_for_write_back(self.age_s if age_s is None else age_s, self.max_in_flight * 8)
        outcomes = list(self._pool.map(self._flush_one, names))
        flushed = sum(n for n, _ in outcomes)
        failures = [exc for _, exc in outcomes if exc is not None]
        self.tier.keep_ledger()
        if failures:
            log.warning("write-back of %d of %d supercuboids postponed: %s", len(failures), len(names), failures[0])
        store_failures = [exc for exc in failures if not isinstance(exc, LockTimeout)]
        if names and flushed == 0 and len(store_failures) == len(names):
            full = all(isinstance(exc, StorageFull) for exc in store_failures)
            raise (StorageFull if full else StorageError)(f"no supercuboid could be written back: {store_failures[0]}")
        return flushed

    def _flush_one(self, name: str) -> tuple[int, StorageError | None]:
        try:
            flushed = self.tier.flush([name])
        except (LockTimeout, StorageError) as exc:
            self.observer.count("flushes_postponed_total", kind=type(exc).__name__)
            return 0, exc
        self.observer.count("flushes_total", flushed)
        return flushed, None

    def run(self, stop: threading.Event) -> None:
        rounds(self.run_once, self.interval_s, stop, "flusher", self.observer)


@dataclass
class CacheManager:
    tier: EvictionDaemon
    high_bytes: int
    low_bytes: int
    interval_s: float = 1.0
    batch: int = 16
    lock_timeout_s: float = 0.2
    observer: Observer = NULL

    def run_once(self) -> int:
        if self.tier.memory_used() <= self.high_bytes:
            return 0
        self.tier.check_ledger()  # eviction writes dirty supercuboids back: not from a Redis that came back short
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
            evicted = int(self.tier.evict(name, self.lock_timeout_s))
        except (LockTimeout, StorageError) as exc:
            log.info("eviction of %s skipped: %s", name, exc)
            return 0
        self.observer.count("evictions_total", evicted)
        return evicted

    def run(self, stop: threading.Event) -> None:
        rounds(self.run_once, self.interval_s, stop, "cache-manager", self.observer)
