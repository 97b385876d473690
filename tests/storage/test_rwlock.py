"""What RedisRWLocks promises beyond the locks' contract (ndstore/testing/locks.py, run on it in
tests/contracts/test_locks.py), on a real redis-server: fairness (no stream of writers or readers
starves the other kind), pub/sub wake-ups, leases renewed while held, recovery from holders killed
with SIGKILL, batches of many names, and mutual exclusion across processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import signal
import threading
import time
from pathlib import Path

import pytest
import redis

from ndstore.core.errors import LockTimeout
from ndstore.ops.localstack import free_port, start_redis
from ndstore.storage.rwlock import RECONNECT_PAUSES_S, RedisRWLocks


@pytest.fixture
def locks(redis_url: str) -> RedisRWLocks:
    return RedisRWLocks(redis.Redis.from_url(redis_url), lease_ms=1000, timeout_s=5)


def quick(redis_url: str, timeout: float = 0.2) -> RedisRWLocks:
    return RedisRWLocks(redis.Redis.from_url(redis_url), lease_ms=1000, timeout_s=timeout)


def test_waiting_writer_blocks_new_readers(locks: RedisRWLocks, redis_url: str) -> None:
    got_write = threading.Event()
    with locks.read(["p"]):
        writer = threading.Thread(target=lambda: (quick(redis_url, 5).write(["p"]).__enter__(), got_write.set()))
        writer.start()
        time.sleep(0.2)  # the writer is waiting now
        with pytest.raises(LockTimeout):
            with quick(redis_url).read(["p"]):
                pass
        assert not got_write.is_set()
    assert got_write.wait(2)


def _stream_of_writers(redis_url: str, name: str, stop: threading.Event,
                       hold_s: float = 0.03) -> list[threading.Thread]:
    """Two writers taking turns without a gap: there is always one holding or waiting."""
    def write_forever() -> None:
        mine = quick(redis_url, 10)
        while not stop.is_set():
            with mine.write([name]):
                time.sleep(hold_s)

    threads = [threading.Thread(target=write_forever) for _ in range(2)]
    for t in threads:
        t.start()
    return threads


def test_a_stream_of_writers_does_not_starve_a_reader(redis_url: str) -> None:
    """Before, a waiting writer kept every new reader out, so two writers taking turns kept a
    reader waiting until its lock timeout (a 503 to a viewer while an annotator wrote)."""
    stop = threading.Event()
    writers = _stream_of_writers(redis_url, "fair-r", stop)
    try:
        time.sleep(0.2)
        for _ in range(5):
            started = time.monotonic()
            with quick(redis_url, 3).read(["fair-r"]):
                waited = time.monotonic() - started
            assert waited < 1.0, waited  # about two writers' turns, not the lock timeout
    finally:
        stop.set()
        for t in writers:
            t.join()


def test_readers_that_came_after_a_waiting_writer_wait_for_it(locks: RedisRWLocks, redis_url: str) -> None:
    """First come, first served: reader A holds, writer W waits, reader B arrives; B enters only
    after W, and W only after A."""
    order: list[str] = []

    def take(mode: str, who: str) -> None:
        mine = quick(redis_url, 5)
        with (mine.write if mode == "write" else mine.read)(["fifo"]):
            order.append(who)
            time.sleep(0.1)

    with locks.read(["fifo"]):
        w = threading.Thread(target=take, args=("write", "W"))
        w.start()
        time.sleep(0.2)
        b = threading.Thread(target=take, args=("read", "B"))
        b.start()
        time.sleep(0.2)
        assert order == []  # B does not pass the waiting W
        order.append("A released")
    w.join(5)
    b.join(5)
    assert order == ["A released", "W", "B"]


def test_release_wakes_a_waiter_promptly(redis_url: str) -> None:
    holder = RedisRWLocks(redis.Redis.from_url(redis_url), lease_ms=5000, timeout_s=5, poll_s=2.0)
    waiter = RedisRWLocks(redis.Redis.from_url(redis_url), lease_ms=5000, timeout_s=5, poll_s=2.0)
    assert 0.45 < _waited_for_a_release(holder, waiter) < 1.2  # woken by pub/sub, not by the 2 s poll


def _waited_for_a_release(holder: RedisRWLocks, waiter: RedisRWLocks) -> float:
    """How long `waiter` waits for a lock `holder` gives back after 0.5 s (inf: not within 5 s)."""
    waited: list[float] = []
    hold = holder.write(["w"])
    hold.__enter__()

    def wait() -> None:
        start = time.monotonic()
        with waiter.write(["w"]):
            waited.append(time.monotonic() - start)

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.5)
    hold.__exit__(None, None, None)
    t.join(5)
    return waited[0] if waited else float("inf")


def test_a_lock_server_that_is_down_costs_its_clients_no_cpu_and_wakes_them_once_back(tmp_path: Path) -> None:
    """While the redis-server was down, each process's pub/sub thread tried to reach it again in a
    tight loop: more than a core per process (web workers, daemons) for the whole outage. Once the
    server is back, a release wakes a waiter through pub/sub again."""
    port = free_port()
    proc = start_redis(tmp_path / "redis", port, appendfsync="no")
    try:
        url = f"redis://127.0.0.1:{port}/0"
        holder = RedisRWLocks(redis.Redis.from_url(url), lease_ms=5000, timeout_s=5, poll_s=2.0)
        waiter = RedisRWLocks(redis.Redis.from_url(url), lease_ms=5000, timeout_s=5, poll_s=2.0)
        with holder.write(["w"]):
            with pytest.raises(LockTimeout):  # the waiter's subscription is made
                with waiter.write(["w"], timeout_s=0.2):
                    pass
        proc.kill()
        proc.wait()
        time.sleep(0.5)
        used = resource.getrusage(resource.RUSAGE_SELF)
        time.sleep(2)
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime
        assert cpu < 0.5, f"{cpu:.2f} s of CPU in 2 s while the lock server was down"

        proc = start_redis(tmp_path / "redis", port, appendfsync="no")
        time.sleep(RECONNECT_PAUSES_S[1] + 1)  # the subscription is made again at its next try
        assert 0.45 < _waited_for_a_release(holder, waiter) < 1.2  # woken by pub/sub, not by the 2 s poll
    finally:
        proc.kill()
        proc.wait()


def _hold(url: str, mode: str, ready: mp.Event) -> None:  # type: ignore[type-arg]
    locks = RedisRWLocks(redis.Redis.from_url(url), lease_ms=600)
    with getattr(locks, mode)(["k"]):
        ready.set()
        time.sleep(600)


@pytest.mark.parametrize("mode", ["read", "write"])
def test_killed_holder_cannot_wedge_the_lock(redis_url: str, mode: str) -> None:
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_hold, args=(redis_url, mode, ready))
    proc.start()
    assert ready.wait(30)
    with pytest.raises(LockTimeout):
        with quick(redis_url).write(["k"]):
            pass
    os.kill(proc.pid, signal.SIGKILL)  # type: ignore[arg-type]
    proc.join()
    start = time.monotonic()
    with quick(redis_url, 5).write(["k"]):
        pass
    assert time.monotonic() - start < 3


def test_leases_are_renewed_while_held(redis_url: str) -> None:
    locks = RedisRWLocks(redis.Redis.from_url(redis_url), lease_ms=300, timeout_s=0.1)
    with locks.write(["r"]):
        time.sleep(1.0)
        with pytest.raises(LockTimeout):
            with quick(redis_url, 0.1).read(["r"]):
                pass


def test_many_names_are_taken_in_batches_in_order_and_held_while_waiting(locks: RedisRWLocks,
                                                                         redis_url: str) -> None:
    """Past rwlock.BATCH names a caller takes them a batch per call; one busy name in the middle
    keeps it waiting with what it took before that name held, as one-by-one taking did."""
    names = [f"many-{i:04d}" for i in range(600)]
    other = quick(redis_url, 5)
    got, done = threading.Event(), threading.Event()

    def take_all() -> None:
        with locks.read(names):
            got.set()
            done.wait(5)

    with other.write([names[400]]):
        taker = threading.Thread(target=take_all)
        taker.start()
        time.sleep(0.3)
        assert not got.is_set()
        with pytest.raises(LockTimeout):  # names before the busy one are held by the waiting reader
            with quick(redis_url).write([names[10]]):
                pass
        with quick(redis_url).read([names[10], names[599]]):  # readers share; the last is free
            pass
    assert got.wait(3)
    done.set()
    taker.join(5)


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
