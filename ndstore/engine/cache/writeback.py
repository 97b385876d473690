"""Write-back and eviction: what the cache owes the base tier, paid under the supercuboids' locks.

A dirty supercuboid is written back under its read lock (writers wait, readers do not): its
blobs joined into a base-tier object without recompression (absent ones restored from the base
tier, `Copies.completed`), stored, and the dirty mark cleared still under the lock, so no write
slips in between. A dirty supercuboid whose cuboids are gone or damaged is marked lost, never
written back as it is. Eviction drops a supercuboid whole under its write lock, written back
first if dirty. Every write-back outside the flusher's rounds brings the ledger up to date
(`ledger_kept`), so a loss of the cache Redis before the next round does not name it lost.

`WriteBack` is the flusher's (`WriteBackDaemon`), the cache manager's (`EvictionDaemon`) and the
operators' (`Operations`) port of the tier (ndstore/engine/cache/ports.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from ndstore.core.chunks import join_supercuboid
from ndstore.core.errors import DamagedInCache, StorageError
from ndstore.core.keys import SupercuboidKey
from ndstore.engine.base_tier import BaseTier
from ndstore.engine.cache.copies import Copies
from ndstore.engine.cache.loss import Loss
from ndstore.engine.cache.parts import META, parse_meta
from ndstore.storage.interfaces import CuboidCache, RWLocks

log = logging.getLogger(__name__)


class WriteBack:
    def __init__(self, cache: CuboidCache, base: BaseTier, locks: RWLocks, copies: Copies, loss: Loss,
                 pool: ThreadPoolExecutor, clock: Callable[[], float] = time.time):
        """``pool``: where a flush of several supercuboids writes them back side by side."""
        self._cache = cache
        self._base = base
        self._locks = locks
        self._copies = copies
        self._loss = loss
        self._pool = pool
        self._clock = clock

    # -- under locks the caller holds (the tier's coherence, write-through writes) ---------------
    def flush_locked(self, name: str) -> bool:
        """Write one resident supercuboid back to the base tier and mark it clean (True). The
        caller holds its read or write lock, so no write can slip in between. A dirty supercuboid
        whose cuboids are gone or damaged is marked lost, never written back as it is (False)."""
        try:
            raw = self._cache.get_many({name: [META]})[name][0]
            if raw is None:
                raise DamagedInCache(name, "it is marked dirty but its cuboids are gone from the cache Redis")
            dtype, grid = parse_meta(raw)
            count = grid.cuboid_count
            blobs = self._copies.completed(name, dtype, grid, range(count), self._cache.get_all(name, count))
        except DamagedInCache as exc:
            self._loss.found_lost({name: f"{exc} (found {time.strftime('%Y-%m-%d %H:%M:%S')})"})
            self._cache.clear_dirty(name)
            return False
        self._base.store(SupercuboidKey.from_name(name),
                         join_supercuboid([bytes(b or b"") for b in blobs], dtype, grid.cuboid, grid.cuboids_per_super))
        self._cache.clear_dirty(name)
        return True

    def evict_locked(self, name: str) -> bool:
        """Drop a supercuboid from the cache, flushing it first if dirty (True when it was
        written back); the caller holds its write lock."""
        written_back = self._cache.is_dirty([name])[0] and self.flush_locked(name)
        self._cache.evict(name)
        return written_back

    @contextmanager
    def ledger_kept(self) -> Iterator[list[bool]]:
        """For a write-back outside the flusher's rounds (a direct write or read, a merge, an
        eviction, a write-through): the caller appends True for each supercuboid it wrote back;
        on the way out, after the supercuboid locks taken inside are released, the ledger is
        brought up to date, so a loss of the cache Redis before the next round does not name
        them lost."""
        written_back: list[bool] = []
        try:
            yield written_back
        finally:
            if any(written_back):
                try:
                    self._loss.keep_ledger()
                except StorageError as exc:
                    log.warning("the cache ledger was not brought up to date after a write-back (the flusher's "
                                "next round will): %s", exc)

    # -- the flusher (WriteBackDaemon) -----------------------------------------------------------
    def check_ledger(self) -> None:
        """Nothing is written back from a cache Redis that came back short: checked first."""
        self._loss.check_ledger()

    def due_for_write_back(self, age_s: float, limit: int) -> list[str]:
        """Supercuboids dirty for longer than `age_s`, oldest first."""
        return self._cache.dirty_before(self._clock() - age_s, limit)

    def flush(self, names: Sequence[str]) -> int:
        """Flush the named supercuboids that are still dirty, each under its read lock."""
        def one(name: str) -> int:
            with self._locks.read([name]):
                if self._cache.is_dirty([name])[0]:
                    self.flush_locked(name)
                    return 1
            return 0
        return sum(self._pool.map(one, names))

    def keep_ledger(self, final: bool = False) -> None:
        self._loss.keep_ledger(final)

    # -- the cache manager (EvictionDaemon) ------------------------------------------------------
    def evict(self, name: str, lock_timeout_s: float) -> bool:
        """Drop one supercuboid from the cache (written back first if dirty) unless its lock is
        busy for longer than `lock_timeout_s` (LockTimeout). False when it was not resident."""
        with self.ledger_kept() as written_back, self._locks.write([name], timeout_s=lock_timeout_s):
            if not self._cache.resident([name])[0]:
                return False
            written_back.append(self.evict_locked(name))
            return True

    def coldest(self, count: int) -> list[str]:
        """The least recently used resident supercuboids."""
        return self._cache.coldest(count)

    def memory_used(self) -> int:
        return self._cache.used_memory()

    # -- operators (Operations): gauges, a clean stop, a level's write-back ----------------------
    def occupancy(self) -> tuple[int, int]:
        """(resident, dirty) supercuboids."""
        return self._cache.count()

    def write_back_lag(self) -> float:
        """Seconds the longest-dirty supercuboid has waited to be written back (0: none waits)."""
        oldest = self._cache.oldest_dirty()
        return 0.0 if oldest is None else max(0.0, self._clock() - oldest)

    def flush_all(self) -> int:
        total = 0
        while names := self._cache.dirty_before(float("inf"), 256):
            total += self.flush(names)
        return total

    def write_back(self, prefix: str) -> int:
        """Flush every dirty cached supercuboid whose name starts with `prefix` (a channel, a
        level of it): the base tier and its index then hold all of it."""
        return self.flush([n for n in self._cache.names_with_prefix(prefix) if n.startswith(prefix)])
