"""Mutual exclusion of the write lock across processes on a real redis-server, and of the
in-process LocalLocks across threads. (Leases, kills and wake-ups: test_rwlock.py.)"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

import redis

from ndstore.storage.locks import LocalLocks
from ndstore.storage.rwlock import RedisRWLocks


def _increment(url: str, n: int) -> None:
    client = redis.Redis.from_url(url)
    locks = RedisRWLocks(client, timeout_s=30)
    for _ in range(n):
        with locks.write(["counter"]):
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
