"""Exclusive named locks: one in-process implementation, one on Redis for many processes.

The Redis lock is a lease: SET NX PX with a random token, renewed by a background timer while
held, released by a Lua compare-and-delete so a holder never frees a lock it has lost. A holder
that is killed cannot wedge the lock: its lease runs out. Names are taken in sorted order, so
two writers of overlapping sets cannot deadlock.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis

from ndstore.core.errors import LockTimeout, StorageError

_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"


class LocalLocks:
    """Locks shared by the threads of one process (tests, single-process tools)."""

    def __init__(self, timeout_s: float = 30.0):
        self.timeout_s = timeout_s
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    @contextmanager
    def hold(self, names: Sequence[str]) -> Iterator[None]:
        with self._guard:
            locks = [self._locks.setdefault(n, threading.Lock()) for n in sorted(set(names))]
        taken: list[threading.Lock] = []
        try:
            for lock in locks:
                if not lock.acquire(timeout=self.timeout_s):
                    raise LockTimeout(f"could not lock {len(locks)} supercuboids in {self.timeout_s}s")
                taken.append(lock)
            yield
        finally:
            for lock in reversed(taken):
                lock.release()


class RedisLocks:
    """Locks shared by every process that can reach one Redis server."""

    def __init__(self, client: redis.Redis, prefix: str = "ndlock:", lease_ms: int = 30_000, timeout_s: float = 60.0):
        self._redis = client
        self.prefix = prefix
        self.lease_ms = lease_ms
        self.timeout_s = timeout_s
        self._release: Any = client.register_script(_RELEASE)
        self._renew: Any = client.register_script(_RENEW)

    @contextmanager
    def hold(self, names: Sequence[str]) -> Iterator[None]:
        token = secrets.token_hex(16)
        keys = [self.prefix + n for n in sorted(set(names))]
        taken: list[str] = []
        stop = threading.Event()
        try:
            deadline = time.monotonic() + self.timeout_s
            for key in keys:
                self._acquire(key, token, deadline)
                taken.append(key)
            renewer = threading.Thread(target=self._keep_alive, args=(taken, token, stop), daemon=True)
            renewer.start()
            yield
        finally:
            stop.set()
            for key in reversed(taken):
                self._safe(self._release, keys=[key], args=[token])

    def _acquire(self, key: str, token: str, deadline: float) -> None:
        delay = 0.002
        while not self._safe(self._redis.set, key, token, nx=True, px=self.lease_ms):
            if time.monotonic() > deadline:
                raise LockTimeout(f"supercuboid lock {key} is held by another writer; try again")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def _keep_alive(self, keys: list[str], token: str, stop: threading.Event) -> None:
        while not stop.wait(self.lease_ms / 3000):
            try:
                for key in keys:
                    self._renew(keys=[key], args=[token, self.lease_ms])
            except redis.RedisError:
                continue  # Redis is briefly away; the next round tries again before the lease ends

    @staticmethod
    def _safe(fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except redis.RedisError as exc:
            raise StorageError(f"lock server unavailable: {exc}") from exc
