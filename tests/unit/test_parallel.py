"""The pool helpers' guarantees: a windowed map holds at most its window of results, and an
error leaves no call running behind it."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from ndstore.core.parallel import map_completed


class Tally:
    """A count that threads raise and lower, its highest value, and how often it was raised."""

    def __init__(self) -> None:
        self.now = self.most = self.raised = 0
        self._guard = threading.Lock()

    def up(self) -> None:
        with self._guard:
            self.now += 1
            self.raised += 1
            self.most = max(self.most, self.now)

    def down(self) -> None:
        with self._guard:
            self.now -= 1


def test_a_window_bounds_the_results_started_and_not_yet_taken() -> None:
    held = Tally()

    def fetch(key: int) -> int:
        held.up()
        return key * 10

    with ThreadPoolExecutor(8) as pool:
        got = {}
        for key, value in map_completed(pool, fetch, range(40), window=3):
            time.sleep(0.002)  # a slow consumer: without the window, all 40 would be fetched meanwhile
            got[key] = value
            held.down()
    assert got == {k: k * 10 for k in range(40)}
    assert held.most <= 3


def test_without_a_window_every_call_may_start_at_once() -> None:
    started = threading.Barrier(5, timeout=5)  # only passes if all five run together

    def fetch(key: int) -> int:
        started.wait()
        return key

    with ThreadPoolExecutor(8) as pool:
        assert sorted(k for k, _ in map_completed(pool, fetch, range(5))) == list(range(5))


def test_an_error_cancels_what_has_not_started_and_waits_for_what_has() -> None:
    running = Tally()

    def fetch(key: int) -> int:
        running.up()
        try:
            time.sleep(0.01)
            if key == 2:
                raise OSError("the store refused")
            return key
        finally:
            running.down()

    with ThreadPoolExecutor(4) as pool:
        with pytest.raises(OSError, match="refused"):
            for _ in map_completed(pool, fetch, range(100), window=4):
                pass
        assert running.now == 0  # nothing still at work once the error reaches the caller
        assert running.raised < 100
