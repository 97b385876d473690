"""The locks' contract suite (ndstore/testing/locks.py) on every implementation: LocalLocks (one
process's threads), RedisRWLocks on a real redis-server and on a three-node Redis Cluster.
What only RedisRWLocks promises (fairness, leases, wake-ups, processes): tests/storage/test_rwlock.py."""

from __future__ import annotations

import pytest

from ndstore.storage import redis_client
from ndstore.storage.interfaces import RWLocks
from ndstore.storage.locks import LocalLocks
from ndstore.storage.rwlock import RedisRWLocks
from ndstore.testing.locks import LocksContract


class TestLocalLocks(LocksContract):
    readers_share = False  # every mode is exclusive in one process

    @pytest.fixture
    def locks(self) -> RWLocks:
        return LocalLocks(timeout_s=10)


class TestRedisRWLocks(LocksContract):
    @pytest.fixture
    def locks(self, redis_url: str) -> RWLocks:
        return RedisRWLocks(redis_client.connect(redis_url), lease_ms=5000, timeout_s=10)


class TestRedisRWLocksOnACluster(LocksContract):
    @pytest.fixture
    def locks(self, redis_cluster_url: str) -> RWLocks:
        return RedisRWLocks(redis_client.connect(redis_cluster_url), lease_ms=5000, timeout_s=10)
