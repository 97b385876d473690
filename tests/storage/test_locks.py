"""The lease lock on a real redis-server: mutual exclusion across processes, and recovery
from a holder killed with SIGKILL."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import pytest
import redis

from ndstore.core.errors import LockTimeout
from ndstore.storage.locks import LocalLocks, RedisLocks


def _increment(url: str, n: int) -> None:
    client = redis.Redis.from_url(url)
    locks = RedisLocks(client, prefix="t-count:", timeout_s=30)
    for _ in range(n):
        with locks.hold(["counter"]):
            v = int(client.get("t-count-value") or 0)
            time.sleep(0.001)
            client.set("t-count-value", v + 1)


def test_mutual_exclusion_across_processes(redis_url: str) -> None:
    redis.Redis.from_url(redis_url).delete("t-count-value")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_increment, args=(redis_url, 40)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 4
    assert int(redis.Redis.from_url(redis_url).get("t-count-value")) == 160


def _hold_forever(url: str, ready: mp.Event) -> None:  # type: ignore[type-arg]
    with RedisLocks(redis.Redis.from_url(url), prefix="t-kill:", lease_ms=600).hold(["a", "b"]):
        ready.set()
        time.sleep(600)


def test_killed_holder_cannot_wedge_the_lock(redis_url: str) -> None:
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_forever, args=(redis_url, ready))
    holder.start()
    assert ready.wait(30)
    locks = RedisLocks(redis.Redis.from_url(redis_url), prefix="t-kill:", lease_ms=600, timeout_s=0.2)
    with pytest.raises(LockTimeout, match="held by another writer"):
        with locks.hold(["b"]):
            pass
    os.kill(holder.pid, signal.SIGKILL)  # type: ignore[arg-type]
    holder.join()
    locks.timeout_s = 5
    start = time.monotonic()
    with locks.hold(["a", "b"]):
        pass
    assert time.monotonic() - start < 3  # the lease ran out; nothing manual was needed


def test_lease_is_renewed_while_held(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    locks = RedisLocks(client, prefix="t-renew:", lease_ms=300, timeout_s=0.1)
    with locks.hold(["x"]):
        time.sleep(1.0)  # more than three leases
        with pytest.raises(LockTimeout):
            with locks.hold(["x"]):
                pass
    assert client.get("t-renew:x") is None  # released


def test_release_happens_when_the_body_raises(redis_url: str) -> None:
    locks = RedisLocks(redis.Redis.from_url(redis_url), prefix="t-raise:", timeout_s=0.5)
    with pytest.raises(RuntimeError):
        with locks.hold(["y"]):
            raise RuntimeError("boom")
    with locks.hold(["y"]):
        pass


def test_local_locks_exclude_threads() -> None:
    locks, seen, active = LocalLocks(), [], [0]

    def work() -> None:
        for _ in range(50):
            with locks.hold(["s", "t"]):
                active[0] += 1
                seen.append(active[0])
                active[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(seen) == 1 and len(seen) == 200
