"""An in-memory cuboid cache: every port of `CuboidCache` (ndstore/storage/interfaces.py) on
dicts under one lock, for engine tests that need no Redis. It passes the cuboid cache's contract
suite (ndstore/testing/cuboid_cache.py), which RedisCuboidCache passes too.

Built with the LocalLocks its callers take, it offers lock-free commits as well: each checks,
under the cache's own lock, that no thread holds a supercuboid's lock (`LocalLocks.busy`). A
holder takes its lock before its first step in the cache, and every step takes the cache's lock,
so a commit either sees the holder or is applied before the holder's first step: what the Redis
scripts guarantee by running alone. (LocalLocks' read locks are exclusive, so a lock-free read
also declines beside a reader.) What it does not model: a restart (nothing is logged), memory
as Redis counts it (`used_memory` adds up the blobs), a Cluster.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import xxhash

from ndstore.core.errors import DamagedInCache, RedisUnverified
from ndstore.storage.interfaces import CuboidCache, Held

Blob = bytes | memoryview


def _digest(blob: Blob) -> bytes:
    return xxhash.xxh3_64_digest(blob)



class InProcessLocks(Protocol):
    """The locks its callers take, as far as lock-free commits need them (LocalLocks)."""

    def busy(self, name: str) -> bool:
        """Whether any thread holds lock ``name`` now."""

class MemoryCuboidCache:
    """Thread-safe; one instance is one cache (share it between the tiers of a test)."""

    def __init__(self, locks: InProcessLocks | None = None):
        """``locks``: the locks every caller of this cache takes; given, it offers lock-free
        commits (`lock_free`)."""
        self._guard = threading.RLock()
        self._hashes: dict[str, dict[int, bytes]] = {}  # name -> cuboid number -> blob
        self._digests: dict[str, dict[int, bytes]] = {}
        self._index: dict[str, float] = {}  # resident: last access time
        self._dirty: dict[str, float] = {}  # since when
        self._seq = 0
        self._seqs: dict[str, int] = {}
        self._epoch: str | None = None
        self._lost: dict[str, str] = {}
        self._buffered: dict[str, int] = {}
        self._buffered_run: str | None = None
        self._lock_free = MemoryLockFree(self, locks) if locks is not None else None

    @property
    def lock_free(self) -> MemoryLockFree | None:
        return self._lock_free

    def damage(self, name: str, number: int) -> None:
        """Flip a byte of a stored blob, as a failing disk or a stray write would (for tests)."""
        with self._guard:
            blob = bytearray(self._hashes[name][number])
            blob[len(blob) // 2] ^= 0xFF
            self._hashes[name][number] = bytes(blob)

    # -- CuboidStore -----------------------------------------------------------------------------
    def get_many(self, wanted: Mapping[str, Sequence[int]]) -> dict[str, list[bytes | None]]:
        with self._guard:
            return {name: self._blobs(name, numbers) for name, numbers in wanted.items()}

    def _blobs(self, name: str, numbers: Sequence[int]) -> list[bytes | None]:
        stored, digests = self._hashes.get(name, {}), self._digests.get(name, {})
        out: list[bytes | None] = []
        for n in numbers:
            blob = stored.get(n)
            if blob is not None and _digest(blob) != digests.get(n):
                raise DamagedInCache(name, f"cuboid {n} does not match its checksum")
            out.append(blob)
        return out

    def get_if_resident(self, wanted: Mapping[str, Sequence[int]]) -> dict[str, list[bytes | None] | None]:
        with self._guard:
            return {name: self._blobs(name, numbers) if name in self._index else None
                    for name, numbers in wanted.items()}

    def get_all(self, name: str, count: int) -> list[bytes | None]:
        return self.get_many({name: range(count)})[name]

    def put(self, name: str, blobs: Mapping[int, Blob], now: float, dirty: bool) -> None:
        with self._guard:
            if self._epoch is None:
                raise RedisUnverified("the cache has not been checked against its ledger; nothing is stored in it")
            self._store(name, blobs, only_absent=False)
            self._index[name] = now
            if dirty:
                self._mark_dirty(name, now)

    def _store(self, name: str, blobs: Mapping[int, Blob], only_absent: bool) -> None:
        stored, digests = self._hashes.setdefault(name, {}), self._digests.setdefault(name, {})
        for n, blob in blobs.items():
            if not (only_absent and n in stored):
                stored[n], digests[n] = bytes(blob), _digest(blob)

    def _mark_dirty(self, name: str, now: float) -> None:
        self._dirty.setdefault(name, now)
        self._seq += 1
        self._seqs[name] = self._seq

    def touch(self, names: Sequence[str], now: float) -> None:
        with self._guard:
            for name in names:
                if name in self._index:
                    self._index[name] = now

    # -- Residency -------------------------------------------------------------------------------
    def resident(self, names: Sequence[str]) -> list[bool]:
        with self._guard:
            return [n in self._index for n in names]

    def page_in(self, name: str, blobs: Mapping[int, Blob], now: float, run: str) -> None:
        with self._guard:
            self._in_run(run)
            self._store(name, blobs, only_absent=False)
            self._index[name] = now

    def fill(self, name: str, blobs: Mapping[int, Blob], run: str) -> None:
        with self._guard:
            self._in_run(run)
            self._store(name, blobs, only_absent=True)

    def _in_run(self, run: str) -> None:
        if self._epoch != run:
            raise RedisUnverified("the cache restarted without its data while a copy from the base tier was on its "
                                  "way in; it was not stored (retry)")

    def absent(self, name: str, numbers: Sequence[int]) -> list[int]:
        with self._guard:
            stored = self._hashes.get(name, {})
            return [n for n in numbers if n not in stored]

    # -- DirtySet --------------------------------------------------------------------------------
    def dirty_before(self, when: float, limit: int) -> list[str]:
        with self._guard:
            due = sorted((since, name) for name, since in self._dirty.items() if since <= when)
            return [name for _, name in due[:limit]]

    def oldest_dirty(self) -> float | None:
        with self._guard:
            return min(self._dirty.values(), default=None)

    def is_dirty(self, names: Sequence[str]) -> list[bool]:
        with self._guard:
            return [n in self._dirty for n in names]

    def clear_dirty(self, name: str) -> None:
        with self._guard:
            self._dirty.pop(name, None)
            self._seqs.pop(name, None)

    # -- Occupancy -------------------------------------------------------------------------------
    def evict(self, name: str) -> None:
        with self._guard:
            self._hashes.pop(name, None)
            self._digests.pop(name, None)
            self._index.pop(name, None)
            self._dirty.pop(name, None)
            self._seqs.pop(name, None)

    def coldest(self, count: int) -> list[str]:
        with self._guard:
            return [name for _, name in sorted((at, name) for name, at in self._index.items())[:count]]

    def used_memory(self) -> int:
        with self._guard:
            return sum(len(b) for stored in self._hashes.values() for b in stored.values())

    def count(self) -> tuple[int, int]:
        with self._guard:
            return len(self._index), len(self._dirty)

    def names_with_prefix(self, prefix: str) -> list[str]:
        with self._guard:
            return sorted(n for n in {*self._index, *self._dirty} if n.startswith(prefix))

    # -- LossMarks (and Holdings) ----------------------------------------------------------------
    def held(self) -> Held:
        with self._guard:
            return Held(self._epoch, self._seq, dict(self._seqs))

    def start_epoch(self, epoch: str, seq: int) -> None:
        with self._guard:
            self._epoch = epoch
            self._seq = max(self._seq, seq)

    def clear_epoch(self) -> None:
        with self._guard:
            self._epoch = None

    def loss_marks(self, names: Sequence[str]) -> tuple[str | None, dict[str, str], str | None]:
        with self._guard:
            lost = {n: self._lost[n] for n in names if n in self._lost}
            buffered: str | None = None
            if names and self._buffered_run is None:
                buffered = ""  # no record: to be rebuilt from the buffer
            elif any(n in self._buffered for n in names):
                buffered = self._buffered_run
            return self._epoch, lost, buffered

    def mark_lost(self, reasons: Mapping[str, str]) -> None:
        with self._guard:
            self._lost.update(reasons)

    def lost(self) -> dict[str, str]:
        with self._guard:
            return dict(self._lost)

    def forget_lost(self, names: Sequence[str]) -> None:
        with self._guard:
            for name in names:
                self._lost.pop(name, None)

    # -- BufferedRecord --------------------------------------------------------------------------
    def record_buffered(self, run: str, seqs: Mapping[str, int]) -> bool:
        with self._guard:
            if self._buffered_run != run:
                return False
            for name, seq in seqs.items():
                self._buffered[name] = max(self._buffered.get(name, 0), seq)
            return True

    def forget_buffered(self, seqs: Mapping[str, int]) -> None:
        with self._guard:
            for name, seq in seqs.items():
                if name in self._buffered and self._buffered[name] <= seq:
                    del self._buffered[name]

    def sync_buffered(self, run: str, seq: int, held: Mapping[str, int]) -> None:
        with self._guard:
            if self._buffered_run != run:
                self._buffered, self._buffered_run = {}, run
            for name, recorded in list(self._buffered.items()):
                if recorded <= seq and name not in held:
                    del self._buffered[name]
            for name, held_seq in held.items():
                self._buffered[name] = max(self._buffered.get(name, 0), held_seq)

    def buffered(self) -> tuple[str | None, dict[str, int]]:
        with self._guard:
            return self._buffered_run, dict(self._buffered)

    def drop_buffered(self) -> None:
        with self._guard:
            self._buffered, self._buffered_run = {}, None

    # -- for MemoryLockFree, which holds the guard -----------------------------------------------
    def _safe_without_locks(self, names: Sequence[str], locks: InProcessLocks) -> bool:
        return self._epoch is not None and all(
            n in self._index and n not in self._lost and n not in self._buffered and not locks.busy(n) for n in names)


class MemoryLockFree:
    """Lock-free reads and commits (LockFreeCommits) of a MemoryCuboidCache whose callers take ``locks``."""

    def __init__(self, cache: MemoryCuboidCache, locks: InProcessLocks):
        self._cache = cache
        self._locks = locks

    def read_unlocked(self, wanted: Mapping[str, Sequence[int]], now: float) -> dict[str, list[bytes | None]] | None:
        seen = self.read_for_update(wanted, now)
        return None if seen is None else {name: blobs for name, (blobs, _) in seen.items()}

    def read_for_update(self, wanted: Mapping[str, Sequence[int]],
                        now: float) -> dict[str, tuple[list[bytes | None], list[bytes | None]]] | None:
        cache = self._cache
        if not wanted:
            return None
        with cache._guard:
            if not cache._safe_without_locks(list(wanted), self._locks):
                return None
            cache.touch(list(wanted), now)
            return {name: (cache._blobs(name, numbers), [cache._digests.get(name, {}).get(n) for n in numbers])
                    for name, numbers in wanted.items()}

    def commit_unlocked(self, blobs: Mapping[str, Mapping[int, bytes]], expected: Mapping[str, Mapping[int, bytes]],
                        now: float) -> bool:
        cache = self._cache
        with cache._guard:
            if not cache._safe_without_locks(list(blobs), self._locks) or any(
                    cache._digests.get(name, {}).get(n) != digest
                    for name, digests in expected.items() for n, digest in digests.items()):
                return False
            for name, new in blobs.items():
                cache._store(name, new, only_absent=False)
                cache._index[name] = now
                cache._mark_dirty(name, now)
            return True


if TYPE_CHECKING:  # mypy checks that it implements every port of the cuboid cache
    _ported: CuboidCache = MemoryCuboidCache()
