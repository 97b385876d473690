"""The Breaker's states (ndstore/core/stalls.py), on a clock the test holds."""

from __future__ import annotations

import threading

import pytest

from ndstore.core.stalls import Breaker, Stalled


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_timeout_stalls_calls_until_one_probe_gets_an_answer() -> None:
    clock = Clock()
    b = Breaker("the Redis at x", stalled_s=2, clock=clock)
    b.admit(1)  # answering
    b.failed("no answer within 3 s")
    with pytest.raises(Stalled, match="the Redis at x is not answering .no answer within 3 s."):
        b.admit(1)
    clock.now += 2
    b.admit(5)  # the probe goes, and may send more than once
    b.admit(5)
    other: list[BaseException] = []
    t = threading.Thread(target=lambda: _try(b, other))
    t.start()
    t.join()
    assert isinstance(other[0], Stalled)  # another thread waits for the probe's outcome
    b.answered()
    b.admit(1)
    assert not b.stalled


def test_a_failed_probe_stalls_again_and_a_lost_probe_is_replaced() -> None:
    clock = Clock()
    b = Breaker("db", stalled_s=2, clock=clock)
    b.failed("timeout")
    clock.now += 2
    b.admit(5)
    b.failed("timeout again")
    with pytest.raises(Stalled, match="timeout again"):
        b.admit(5)
    clock.now += 2
    b.admit(1)  # a probe whose caller never reports back
    clock.now += 1.5
    got: list[BaseException] = []
    t = threading.Thread(target=lambda: _try(b, got))
    t.start()
    t.join()
    assert got == [], "the probe's time ran out: the next caller probes"


def test_many_servers_behind_one_endpoint_stall_only_after_timeouts_in_a_row() -> None:
    clock = Clock()
    b = Breaker("s3", timeouts=3, clock=clock)
    b.failed("t")
    b.failed("t")
    b.answered()  # one answer between: one slow server, not a stalled endpoint
    b.failed("t")
    b.failed("t")
    b.admit(1)
    b.failed("t")
    with pytest.raises(Stalled):
        b.admit(1)


def _try(b: Breaker, out: list[BaseException]) -> None:
    try:
        b.admit(1)
    except Stalled as exc:
        out.append(exc)
