"""A distributed readers-writer lock per supercuboid, on Redis (one node or a Cluster).

Each lock name N has six keys sharing the hash tag {N} (one Cluster slot, so one Lua script
may touch them all):
  ndrw:{N}:r       sorted set of reader tokens, score = lease expiry (ms, Redis clock)
  ndrw:{N}:w       the writer's token, with a PX lease
  ndrw:{N}:q       sorted set of waiting writers, score = their ticket
  ndrw:{N}:qr      sorted set of waiting readers, score = their ticket
  ndrw:{N}:claims  sorted set of every waiter, score = expiry of its claim
  ndrw:{N}:n       the ticket counter
Every script first drops expired readers and waiters, so a holder killed with SIGKILL wedges
nothing: its lease runs out. The lock is fair: a caller that cannot enter takes a ticket, and no
later arrival passes it. A writer waits for the readers and writers with older tickets; a reader
waits only for writers with older tickets (readers that arrived together enter together), so a
stream of readers cannot starve a writer and a stream of writers cannot starve a reader. Releases PUBLISH on ndrw:{N}; waiters sleep on a
process-wide subscription instead of spinning, with a short fallback timeout so a wake-up lost
between a failed try and the subscription costs milliseconds, not a hang. A background thread
renews the leases of every lock this process holds. Names are taken in sorted order.
See docs/design/locks.md.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import redis

from ndstore.core.errors import LockTimeout, StorageError
from ndstore.core.observe import NULL, Observer

_NOW = "local t = redis.call('TIME') local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) "
# KEYS: 1 readers (token -> lease expiry), 2 writer, 3 waiting writers (token -> ticket),
# 4 waiting readers (token -> ticket), 5 waiters' claims (token -> claim expiry), 6 ticket counter
_COMMON = _NOW + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local dead = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, 1000)
for _, token in ipairs(dead) do
  redis.call('ZREM', KEYS[3], token) redis.call('ZREM', KEYS[4], token) redis.call('ZREM', KEYS[5], token)
end
local function first(queue)
  local head = redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')
  if #head == 0 then return nil end
  return tonumber(head[2])
end
local function wait(queue)
  if not redis.call('ZSCORE', queue, ARGV[1]) then redis.call('ZADD', queue, redis.call('INCR', KEYS[6]), ARGV[1]) end
  redis.call('ZADD', KEYS[5], now + ARGV[2], ARGV[1])
  for i = 3, 6 do redis.call('PEXPIRE', KEYS[i], ARGV[2]) end
  return 0
end
"""
_READ = _COMMON + """
local mine = redis.call('ZSCORE', KEYS[4], ARGV[1])
local writer = first(KEYS[3])
if redis.call('EXISTS', KEYS[2]) == 1 or (writer and (not mine or writer < tonumber(mine))) then
  return wait(KEYS[4])
end
redis.call('ZADD', KEYS[1], now + ARGV[2], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if mine then redis.call('ZREM', KEYS[4], ARGV[1]) redis.call('ZREM', KEYS[5], ARGV[1]) end
return 1"""
_WRITE = _COMMON + """
local mine = redis.call('ZSCORE', KEYS[3], ARGV[1])
local ticket = mine and tonumber(mine) or math.huge
local writer, reader = first(KEYS[3]), first(KEYS[4])
if redis.call('EXISTS', KEYS[2]) == 0 and redis.call('ZCARD', KEYS[1]) == 0
    and (not writer or writer >= ticket) and (not reader or reader > ticket) then
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[5], ARGV[1])
  return 1
end
return wait(KEYS[3])"""
_RELEASE = """
local freed = 0
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) freed = 1 end
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 and redis.call('ZCARD', KEYS[1]) == 0 then freed = 1 end
if redis.call('ZREM', KEYS[3], ARGV[1]) + redis.call('ZREM', KEYS[4], ARGV[1]) > 0 then freed = 1 end
redis.call('ZREM', KEYS[5], ARGV[1])
if freed == 1 then redis.call('PUBLISH', ARGV[2], 'free') end
return freed"""
_RENEW = _NOW + """
if redis.call('GET', KEYS[2]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[2], ARGV[2]) end
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + ARGV[2], ARGV[1])
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0"""

CHANNEL_PREFIX = "ndrw:"


def _keys(name: str) -> list[str]:
    return [f"ndrw:{{{name}}}:{part}" for part in ("r", "w", "q", "qr", "claims", "n")]


class _Waker:
    """One pattern subscription per process; waiters block on an Event per lock name."""

    def __init__(self, client: redis.Redis):
        self._events: dict[str, threading.Event] = {}
        self._guard = threading.Lock()
        self._pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        self._pubsub.psubscribe(**{f"{CHANNEL_PREFIX}*": self._on_message})
        self._thread = self._pubsub.run_in_thread(sleep_time=1.0, daemon=True,
                                                  exception_handler=lambda exc, pubsub, thread: None)

    def _on_message(self, message: dict[str, Any]) -> None:
        name = message["channel"].decode()[len(CHANNEL_PREFIX):]
        with self._guard:
            event = self._events.get(name)
        if event is not None:
            event.set()

    def event(self, name: str) -> threading.Event:
        with self._guard:
            return self._events.setdefault(name, threading.Event())

    def close(self) -> None:
        self._thread.stop()
        self._pubsub.close()


class RedisRWLocks:
    """Readers-writer locks by name. `hold` (exclusive) is `write`, for the base tier."""

    def __init__(self, client: redis.Redis, lease_ms: int = 30_000, timeout_s: float = 60.0,
                 poll_s: float = 0.05, observer: Observer = NULL):
        """`observer`: told how long each lock that was busy kept its taker waiting, and of
        every lock that could not be taken in time."""
        self._observer = observer
        self._redis = client
        self.lease_ms = lease_ms
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self._scripts = {n: client.register_script(s) for n, s in
                         (("read", _READ), ("write", _WRITE), ("release", _RELEASE), ("renew", _RENEW))}
        self._held: dict[tuple[str, str], None] = {}
        self._held_guard = threading.Lock()
        self._waker: _Waker | None = None
        self._renewer = threading.Thread(target=self._renew_forever, daemon=True, name="rwlock-renew")
        self._renewer.start()

    def read(self, names: Sequence[str], timeout_s: float | None = None) -> AbstractContextManager[None]:
        return self.mixed(reads=names, timeout_s=timeout_s)

    def write(self, names: Sequence[str], timeout_s: float | None = None) -> AbstractContextManager[None]:
        return self.mixed(writes=names, timeout_s=timeout_s)

    hold = write

    @contextmanager
    def mixed(self, reads: Sequence[str] = (), writes: Sequence[str] = (),
              timeout_s: float | None = None) -> Iterator[None]:
        """Read locks on ``reads`` and write locks on ``writes`` (a name in both: write), held
        together, taken in one sorted order with every other caller's."""
        token = secrets.token_hex(12)
        modes = {**{n: "read" for n in reads}, **{n: "write" for n in writes}}
        taken: list[str] = []
        try:
            deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
            for name in sorted(modes):
                self._acquire(name, token, modes[name], deadline)
                taken.append(name)
            yield
        finally:
            for name in reversed(taken):
                self._release(name, token)

    def _acquire(self, name: str, token: str, mode: str, deadline: float) -> None:
        event: threading.Event | None = None
        started: float | None = None
        while True:
            if self._call(mode, name, token, self.lease_ms):
                with self._held_guard:
                    self._held[(name, token)] = None
                if started is not None:
                    self._observer.observe("lock_wait_seconds", time.monotonic() - started, mode=mode)
                return
            started = started if started is not None else time.monotonic()
            if time.monotonic() > deadline:
                self._call("release", name, token, f"{CHANNEL_PREFIX}{name}")  # withdraw a writer's claim
                self._observer.count("lock_timeouts_total", mode=mode)
                raise LockTimeout(f"supercuboid {name} stayed locked too long; try again")
            event = event or self._wake_event(name)
            event.wait(self.poll_s)
            event.clear()

    def _release(self, name: str, token: str) -> None:
        with self._held_guard:
            self._held.pop((name, token), None)
        try:
            self._call("release", name, token, f"{CHANNEL_PREFIX}{name}")
        except StorageError:
            pass  # the lease will run out; never mask the caller's own outcome

    def _wake_event(self, name: str) -> threading.Event:
        if self._waker is None:
            with self._held_guard:
                if self._waker is None:
                    self._waker = _Waker(self._redis)
        return self._waker.event(name)

    def _call(self, script: str, name: str, *args: Any) -> Any:
        try:
            return self._scripts[script](keys=_keys(name), args=list(args))
        except redis.RedisError as exc:
            raise StorageError(f"lock server unavailable: {exc}") from exc

    def _renew_forever(self) -> None:
        while True:
            time.sleep(self.lease_ms / 3000)
            with self._held_guard:
                held = list(self._held)
            for name, token in held:
                try:
                    self._call("renew", name, token, self.lease_ms)
                except StorageError:
                    break  # Redis is briefly away; retry next round, before the leases end
