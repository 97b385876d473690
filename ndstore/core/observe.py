"""What the engine and the daemons report about their work, as counters and observed values.

A port: the engine calls `count` and `observe` on whatever Observer it was given; the wiring
gives it one that adds into shared counters for `/metrics` (ndstore.storage.redis_metrics), and
tests and tools give it the one that records nothing. Names are Prometheus metric names without
the `ndstore_` prefix; labels are a few fixed words (a route, a kind of error), never ids.
"""

from __future__ import annotations

from typing import Protocol

# Latency buckets (seconds) of every duration histogram: a 1-voxel read to a 1 GiB cutout.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Observer(Protocol):
    def count(self, name: str, value: float = 1, **labels: str) -> None:
        """Add `value` to the counter `name` with these labels."""

    def observe(self, name: str, value: float, **labels: str) -> None:
        """Record one value (a duration in seconds) into the histogram `name`."""


class NullObserver:
    """Records nothing (tests, one-off tools)."""

    def count(self, name: str, value: float = 1, **labels: str) -> None:
        pass

    def observe(self, name: str, value: float, **labels: str) -> None:
        pass


NULL = NullObserver()
