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
stream of readers cannot starve a writer and a stream of writers cannot starve a reader.
Releases PUBLISH on ndrw:{N}; waiters sleep on a process-wide subscription instead of spinning,
with a short fallback timeout so a wake-up lost between a failed try and the subscription costs
milliseconds, not a hang. A background thread renews the leases of every lock this process holds.
Names are taken in sorted order, up to BATCH names per script call (one name per call on a
Cluster, whose names live in different slots).
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

# Each script works on several locks at once (six keys per lock name, in the order of _keys):
#   1 readers (token -> lease expiry)   2 writer           3 waiting writers (token -> ticket)
#   4 waiting readers (token -> ticket)  5 waiters' claims (token -> claim expiry)   6 ticket counter
_PRELUDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local token, lease = ARGV[1], tonumber(ARGV[2])
"""
_ACQUIRE = _PRELUDE + """
local function first(queue)
  local head = redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')
  if #head == 0 then return nil end
  return tonumber(head[2])
end
local function prune(k)
  redis.call('ZREMRANGEBYSCORE', KEYS[k + 1], '-inf', now)
  local dead = redis.call('ZRANGEBYSCORE', KEYS[k + 5], '-inf', now, 'LIMIT', 0, 1000)
  for _, d in ipairs(dead) do
    redis.call('ZREM', KEYS[k + 3], d) redis.call('ZREM', KEYS[k + 4], d) redis.call('ZREM', KEYS[k + 5], d)
  end
end
local function wait(k, queue)
  if not redis.call('ZSCORE', queue, token) then redis.call('ZADD', queue, redis.call('INCR', KEYS[k + 6]), token) end
  redis.call('ZADD', KEYS[k + 5], now + lease, token)
  for i = 3, 6 do redis.call('PEXPIRE', KEYS[k + i], lease) end
  return false
end
local function read(k)
  local mine = redis.call('ZSCORE', KEYS[k + 4], token)
  local writer = first(KEYS[k + 3])
  if redis.call('EXISTS', KEYS[k + 2]) == 1 or (writer and (not mine or writer < tonumber(mine))) then
    return wait(k, KEYS[k + 4])
  end
  redis.call('ZADD', KEYS[k + 1], now + lease, token)
  redis.call('PEXPIRE', KEYS[k + 1], lease)
  if mine then redis.call('ZREM', KEYS[k + 4], token) redis.call('ZREM', KEYS[k + 5], token) end
  return true
end
local function write(k)
  local mine = redis.call('ZSCORE', KEYS[k + 3], token)
  local ticket = mine and tonumber(mine) or math.huge
  local writer, reader = first(KEYS[k + 3]), first(KEYS[k + 4])
  if redis.call('EXISTS', KEYS[k + 2]) == 0 and redis.call('ZCARD', KEYS[k + 1]) == 0
      and (not writer or writer >= ticket) and (not reader or reader > ticket) then
    redis.call('SET', KEYS[k + 2], token, 'PX', lease)
    redis.call('ZREM', KEYS[k + 3], token)
    redis.call('ZREM', KEYS[k + 5], token)
    return true
  end
  return wait(k, KEYS[k + 3])
end
local taken = 0
for i = 1, #KEYS / 6 do
  local k = (i - 1) * 6
  prune(k)
  local ok
  if string.sub(ARGV[3], i, i) == 'w' then ok = write(k) else ok = read(k) end
  if not ok then return taken end
  taken = taken + 1
end
return taken"""
_RELEASE = _PRELUDE + """
local released = 0
for i = 1, #KEYS / 6 do
  local k = (i - 1) * 6
  local freed = 0
  if redis.call('GET', KEYS[k + 2]) == token then redis.call('DEL', KEYS[k + 2]) freed = 1 end
  if redis.call('ZREM', KEYS[k + 1], token) == 1 and redis.call('ZCARD', KEYS[k + 1]) == 0 then freed = 1 end
  if redis.call('ZREM', KEYS[k + 3], token) + redis.call('ZREM', KEYS[k + 4], token) > 0 then freed = 1 end
  redis.call('ZREM', KEYS[k + 5], token)
  if freed == 1 then redis.call('PUBLISH', ARGV[i + 2], 'free') released = released + 1 end
end
return released"""
_RENEW = _PRELUDE + """
if redis.call('GET', KEYS[2]) == token then return redis.call('PEXPIRE', KEYS[2], lease) end
if redis.call('ZSCORE', KEYS[1], token) then
  redis.call('ZADD', KEYS[1], now + lease, token)
  return redis.call('PEXPIRE', KEYS[1], lease)
end
return 0"""
BATCH = 256  # locks per script call: one call stays well under a millisecond of Redis time per lock

CHANNEL_PREFIX = "ndrw:"
# between a lost subscription's tries to reach its server again: doubling from the first to the
# last, and from the first again once it has not failed for a while
RECONNECT_PAUSES_S = (0.1, 2.0)


def _keys(name: str) -> list[str]:
    return [f"ndrw:{{{name}}}:{part}" for part in ("r", "w", "q", "qr", "claims", "n")]


def _server(client: redis.Redis) -> tuple[object, ...] | None:
    """Where a client connects: (host, port, unix socket, database); None for a Cluster."""
    if isinstance(client, redis.RedisCluster):
        return None
    kwargs = client.connection_pool.connection_kwargs
    return kwargs.get("host"), kwargs.get("port"), kwargs.get("path"), kwargs.get("db", 0)


class _Waker:
    """One pattern subscription per process; waiters block on an Event per lock name."""

    def __init__(self, client: redis.Redis):
        self._events: dict[str, threading.Event] = {}
        self._guard = threading.Lock()
        self._pause_s, self._failed_at = 0.0, float("-inf")
        self._pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        self._pubsub.psubscribe(**{f"{CHANNEL_PREFIX}*": self._on_message})
        self._thread = self._pubsub.run_in_thread(sleep_time=1.0, daemon=True, exception_handler=self._on_error)

    def _on_error(self, exc: BaseException, pubsub: Any, thread: Any) -> None:
        """The server is gone (a restart, a crash). redis-py's worker tries again at once, in a
        loop that burnt more than a core per process for as long as the server was down; it
        waits here between tries, longer each time up to RECONNECT_PAUSES_S[1]. Waiters
        meanwhile wake on their own fallback timeout."""
        first, last = RECONNECT_PAUSES_S
        now = time.monotonic()
        recovered = now - self._failed_at > 2 * last + 1  # no failure since well past the last pause
        self._pause_s = first if recovered else min(2 * self._pause_s, last)
        self._failed_at = now
        time.sleep(self._pause_s)

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
                         (("acquire", _ACQUIRE), ("release", _RELEASE), ("renew", _RENEW))}
        # a Cluster spreads lock names over slots: one script may touch only one name's keys there
        self._batch = 1 if isinstance(client, redis.RedisCluster) else BATCH
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

    @staticmethod
    def keys(name: str) -> tuple[str, str]:
        """(readers, writer) of lock ``name``: the sorted set of its readers (empty or absent while
        none holds it, though a dead reader's entry stays until a script prunes it) and the key that
        exists exactly while a writer holds it. For scripts of an adapter in the same Redis that
        must not run beside a holder (the cache's lock-free commits)."""
        readers, writer = _keys(name)[:2]
        return readers, writer

    def same_redis(self, client: redis.Redis) -> bool:
        """Whether ``client`` talks to the Redis (one server, one database) that keeps these locks."""
        return _server(client) is not None and _server(client) == _server(self._redis)

    @contextmanager
    def mixed(self, reads: Sequence[str] = (), writes: Sequence[str] = (),
              timeout_s: float | None = None) -> Iterator[None]:
        """Read locks on ``reads`` and write locks on ``writes`` (a name in both: write), held
        together, taken in one sorted order with every other caller's (up to BATCH per Redis
        call: a box over thousands of supercuboids costs tens of calls, not thousands)."""
        token = secrets.token_hex(12)
        modes = {**{n: "r" for n in reads}, **{n: "w" for n in writes}}
        names = sorted(modes)
        taken = 0
        try:
            deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
            while taken < len(names):
                taken += self._acquire(names[taken:taken + self._batch], modes, token, deadline)
            yield
        finally:
            self._release(names[:taken], token)

    def _acquire(self, names: list[str], modes: dict[str, str], token: str, deadline: float) -> int:
        """Take a prefix of `names` (at least one, waiting for it if it is busy); how many."""
        event: threading.Event | None = None
        started: float | None = None
        while True:
            got = int(self._call("acquire", names, token, self.lease_ms, "".join(modes[n] for n in names)))
            if got:
                with self._held_guard:
                    self._held.update(((n, token), None) for n in names[:got])
                if started is not None:
                    self._observer.observe("lock_wait_seconds", time.monotonic() - started,
                                           mode="write" if modes[names[0]] == "w" else "read")
                return got
            busy = names[0]
            mode = "write" if modes[busy] == "w" else "read"
            started = started if started is not None else time.monotonic()
            if time.monotonic() > deadline:
                self._call("release", [busy], token, self.lease_ms, f"{CHANNEL_PREFIX}{busy}")  # withdraw its ticket
                self._observer.count("lock_timeouts_total", mode=mode)
                raise LockTimeout(f"supercuboid {busy} stayed locked too long; try again")
            event = event or self._wake_event(busy)
            event.wait(self.poll_s)
            event.clear()

    def _release(self, names: list[str], token: str) -> None:
        with self._held_guard:
            for name in names:
                self._held.pop((name, token), None)
        for start in range(0, len(names), self._batch):
            batch = names[start:start + self._batch]
            try:
                self._call("release", batch, token, self.lease_ms, *(f"{CHANNEL_PREFIX}{n}" for n in batch))
            except StorageError:
                pass  # the leases will run out; never mask the caller's own outcome

    def _wake_event(self, name: str) -> threading.Event:
        if self._waker is None:
            with self._held_guard:
                if self._waker is None:
                    self._waker = _Waker(self._redis)
        return self._waker.event(name)

    def _call(self, script: str, names: list[str], *args: Any) -> Any:
        try:
            return self._scripts[script](keys=[k for n in names for k in _keys(n)], args=list(args))
        except redis.RedisError as exc:
            raise StorageError(f"lock server unavailable: {exc}") from exc

    def _renew_forever(self) -> None:
        while True:
            time.sleep(self.lease_ms / 3000)
            with self._held_guard:
                held = list(self._held)
            try:
                for start in range(0, len(held), self._batch):
                    if self._batch == 1:  # a Cluster: scripts one by one
                        self._scripts["renew"](keys=_keys(held[start][0]), args=[held[start][1], self.lease_ms])
                        continue
                    pipe = self._redis.pipeline(transaction=False)
                    for name, token in held[start:start + self._batch]:
                        self._scripts["renew"](keys=_keys(name), args=[token, self.lease_ms], client=pipe)
                    pipe.execute()
            except redis.RedisError:
                pass  # Redis is briefly away; retry next round, before the leases end
