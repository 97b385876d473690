"""The contract of the locks ports (`RWLocks`, `ExclusiveLocks`: ndstore/storage/interfaces.py),
written once and run on every implementation: subclass `LocksContract` and give it the `locks`
fixture (tests/contracts/test_locks.py runs it on LocalLocks, RedisRWLocks on a redis-server and
on a Redis Cluster).

What every implementation keeps: a writer excludes everyone, a reader excludes writers, `hold`
is the write mode, `mixed` holds both kinds together, a body that raises or a lock not taken in
time leaves nothing held, names are taken in one order (no deadlock between overlapping sets),
and a counter under a write lock counts every increment of many threads. Readers share where
`readers_share` (RedisRWLocks; LocalLocks' read locks are exclusive). What only one
implementation promises (fairness, leases that outlive a killed holder, wake-ups, processes)
is tested beside it (tests/storage/test_rwlock.py).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import ClassVar

import pytest

from ndstore.core.errors import LockTimeout
from ndstore.storage.interfaces import RWLocks

SHORT_S = 0.2  # how long a test waits for a lock it must not get
LONG_S = 10.0  # how long it waits for one it must get


class LocksContract:
    """Subclass it and give ``locks``: a lock service with nothing held under the names a test
    makes (`names` makes fresh ones)."""

    readers_share: ClassVar[bool] = True

    @pytest.fixture
    def locks(self) -> RWLocks:
        raise NotImplementedError("a subclass gives the locks under test")

    @pytest.fixture
    def names(self) -> Callable[[str], str]:
        """Lock names of this test only (a shared server keeps other tests' locks)."""
        prefix = uuid.uuid4().hex[:10]
        return lambda name: f"t-{prefix}-{name}"

    # -- exclusion ---------------------------------------------------------------------------------
    def test_a_writer_excludes_readers_and_writers(self, locks: RWLocks, names: Callable[[str], str]) -> None:
        a = names("a")
        with held_elsewhere(locks.write([a])):
            refused(locks.write([a], timeout_s=SHORT_S))
            refused(locks.read([a], timeout_s=SHORT_S))
        with locks.write([a], timeout_s=LONG_S):
            pass

    def test_a_reader_excludes_writers(self, locks: RWLocks, names: Callable[[str], str]) -> None:
        a = names("a")
        with held_elsewhere(locks.read([a])):
            refused(locks.write([a], timeout_s=SHORT_S))
        with locks.write([a], timeout_s=LONG_S):
            pass

    def test_readers_share(self, locks: RWLocks, names: Callable[[str], str]) -> None:
        if not self.readers_share:
            pytest.skip("read locks are exclusive in this implementation")
        a = names("a")
        with held_elsewhere(locks.read([a])), locks.read([a], timeout_s=SHORT_S):
            pass

    def test_hold_is_the_write_mode(self, locks: RWLocks, names: Callable[[str], str]) -> None:
        a = names("a")
        with held_elsewhere(locks.hold([a])):
            refused(locks.read([a], timeout_s=SHORT_S))
            refused(locks.write([a], timeout_s=SHORT_S))

    def test_mixed_holds_read_and_write_locks_together(self, locks: RWLocks, names: Callable[[str], str]) -> None:
        r, w, both = names("r"), names("w"), names("both")
        with held_elsewhere(locks.mixed(reads=[r, both], writes=[w, both])):
            refused(locks.write([r], timeout_s=SHORT_S))
            refused(locks.read([w], timeout_s=SHORT_S))
            refused(locks.read([both], timeout_s=SHORT_S))  # a name in both modes is written
            if self.readers_share:
                with locks.read([r], timeout_s=SHORT_S):
                    pass
        with locks.write([r, w, both], timeout_s=LONG_S):
            pass

    # -- nothing stays held ------------------------------------------------------------------------
    def test_a_body_that_raises_releases_every_lock(self, locks: RWLocks, names: Callable[[str], str]) -> None:
        a, b = names("a"), names("b")
        with pytest.raises(RuntimeError, match="boom"), locks.mixed(reads=[a], writes=[b]):
            raise RuntimeError("boom")
        with held_elsewhere(locks.write([b, a])):
            pass

    def test_a_lock_not_taken_in_time_leaves_none_held(self, locks: RWLocks, names: Callable[[str], str]) -> None:
        a, b = names("a"), names("b")
        with held_elsewhere(locks.write([b])):
            refused(locks.write([a, b], timeout_s=SHORT_S))  # `a` comes first and was taken
            with held_elsewhere(locks.write([a])):  # and was released again
                pass

    def test_duplicate_and_no_names(self, locks: RWLocks, names: Callable[[str], str]) -> None:
        a = names("a")
        with locks.write([a, a], timeout_s=LONG_S), locks.write([], timeout_s=SHORT_S):
            pass
        with held_elsewhere(locks.write([a])):
            pass

    # -- many threads ------------------------------------------------------------------------------
    def test_a_counter_under_a_write_lock_counts_every_increment(self, locks: RWLocks,
                                                                 names: Callable[[str], str]) -> None:
        c, counter = names("c"), [0]

        def work(_thread: int) -> None:
            for _ in range(25):
                with locks.write([c], timeout_s=LONG_S):
                    seen = counter[0]
                    time.sleep(0.0005)  # a lost update would show here
                    counter[0] = seen + 1

        run_threads(work, 4)
        assert counter[0] == 100

    def test_overlapping_sets_taken_in_any_order_do_not_deadlock(self, locks: RWLocks,
                                                                 names: Callable[[str], str]) -> None:
        p, q, r = names("p"), names("q"), names("r")
        orders = [[p, q, r], [r, q, p], [q, p], [r, p]]
        done: list[int] = []

        def work(i: int) -> None:
            for _ in range(10):
                with locks.write(orders[i], timeout_s=LONG_S):
                    pass
            done.append(i)

        run_threads(work, len(orders))
        assert sorted(done) == list(range(len(orders)))


@contextmanager
def held_elsewhere(lock: AbstractContextManager[None]) -> Iterator[None]:
    """``lock`` taken by another thread for the length of the block (as another process would)."""
    taken, release, failed = threading.Event(), threading.Event(), []

    def hold() -> None:
        try:
            with lock:
                taken.set()
                release.wait(LONG_S * 3)
        except BaseException as exc:  # noqa: BLE001 - reported to the test below
            failed.append(exc)
            taken.set()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert taken.wait(LONG_S), "the other holder never got the lock"
    if failed:
        raise failed[0]
    try:
        yield
    finally:
        release.set()
        thread.join(LONG_S)


def refused(lock: AbstractContextManager[None]) -> None:
    """``lock`` is not granted in its timeout: LockTimeout, and nothing held afterwards."""
    started = time.monotonic()
    with pytest.raises(LockTimeout), lock:
        pass
    assert time.monotonic() - started < LONG_S


def run_threads(work: Callable[[int], None], count: int) -> None:
    """``work(i)`` on ``count`` threads at once, i = 0, 1, ...; every one must finish, unfailed."""
    failures: list[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i)
        except BaseException as exc:  # noqa: BLE001 - reported to the test below
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(LONG_S * 6)
    assert not any(t.is_alive() for t in threads), "a thread never finished: a deadlock?"
    assert not failures, failures
