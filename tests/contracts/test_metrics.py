"""The SharedMetrics contract on each implementation: RedisMetrics on a real redis-server (a
database of the session's Redis of its own, emptied for each test; each recorder its own client,
as each process has) and the in-memory fake (recorders sharing one MetricsTable)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from ndstore.storage.interfaces import SharedMetrics
from ndstore.storage.redis_metrics import RedisMetrics
from ndstore.testing.memory import MemoryMetrics, MetricsTable
from ndstore.testing.metrics import SharedMetricsContract

METRICS_DB = 7  # the cache tier's tests empty database 0 of the same server


class TestRedisMetrics(SharedMetricsContract):
    @pytest.fixture
    def recorder(self, redis_url: str) -> Callable[[], SharedMetrics]:
        url = f"{redis_url.rsplit('/', 1)[0]}/{METRICS_DB}"
        redis.Redis.from_url(url).flushdb()
        return lambda: RedisMetrics(redis.Redis.from_url(url))


class TestMemoryMetrics(SharedMetricsContract):
    @pytest.fixture
    def recorder(self) -> Callable[[], SharedMetrics]:
        table = MetricsTable()
        return lambda: MemoryMetrics(table)
