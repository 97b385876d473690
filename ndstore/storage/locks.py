"""Named locks for one process (tests and single-process tools). Every mode is exclusive here;
many processes share ndstore.storage.rwlock.RedisRWLocks instead."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager

from ndstore.core.errors import LockTimeout


class LocalLocks:
    """Locks shared by the threads of one process; `read` and `write` are both exclusive."""

    def __init__(self, timeout_s: float = 30.0):
        self.timeout_s = timeout_s
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    @contextmanager
    def hold(self, names: Sequence[str], timeout_s: float | None = None) -> Iterator[None]:
        with self._guard:
            locks = [self._locks.setdefault(n, threading.Lock()) for n in sorted(set(names))]
        taken: list[threading.Lock] = []
        try:
            for lock in locks:
                if not lock.acquire(timeout=self.timeout_s if timeout_s is None else timeout_s):
                    raise LockTimeout(f"could not lock {len(locks)} supercuboids in time")
                taken.append(lock)
            yield
        finally:
            for lock in reversed(taken):
                lock.release()

    read = hold
    write = hold

    def busy(self, name: str) -> bool:
        """Whether any thread holds lock ``name`` now (what an in-process cache's lock-free
        commits check, ndstore/testing/memory_cache.py)."""
        with self._guard:
            lock = self._locks.get(name)
        return lock is not None and lock.locked()

    def mixed(self, reads: Sequence[str] = (), writes: Sequence[str] = (),
              timeout_s: float | None = None) -> AbstractContextManager[None]:
        return self.hold([*reads, *writes], timeout_s)
