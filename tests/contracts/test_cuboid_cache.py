"""The cuboid cache's contract suite (ndstore/testing/cuboid_cache.py) on every implementation:
RedisCuboidCache on a real redis-server (with the locks in the same Redis: lock-free commits),
on a three-node Redis Cluster, and the in-memory MemoryCuboidCache (with LocalLocks: lock-free
commits too)."""

from __future__ import annotations

import pytest
import redis
from redis.cluster import RedisCluster

from ndstore.storage import redis_client
from ndstore.storage.interfaces import CuboidCache, RWLocks
from ndstore.storage.locks import LocalLocks
from ndstore.storage.redis_cache import RedisCuboidCache
from ndstore.storage.rwlock import RedisRWLocks
from ndstore.testing.cuboid_cache import CuboidCacheContract
from ndstore.testing.memory_cache import MemoryCuboidCache


def flip_a_byte(client: redis.Redis, name: str, number: int) -> None:
    key = f"ndc:{{{name}}}"
    blob = bytearray(client.hget(key, str(number)) or b"")
    blob[len(blob) // 2] ^= 0xFF
    client.hset(key, str(number), bytes(blob))


class TestRedisCuboidCache(CuboidCacheContract):
    @pytest.fixture
    def client(self, redis_url: str) -> redis.Redis:
        client = redis_client.connect(redis_url)
        client.flushdb()
        return client

    @pytest.fixture
    def locks(self, client: redis.Redis) -> RWLocks | None:
        return RedisRWLocks(client, timeout_s=10)

    @pytest.fixture
    def cache(self, client: redis.Redis, locks: RedisRWLocks) -> CuboidCache:
        return RedisCuboidCache(client, locks)

    def damage(self, cache: CuboidCache, name: str, number: int) -> None:
        flip_a_byte(cache._redis, name, number)  # type: ignore[attr-defined]


class TestRedisClusterCuboidCache(CuboidCacheContract):
    atomic_runs = False  # the marks live in another slot than a supercuboid's hash

    @pytest.fixture
    def cache(self, redis_cluster_url: str) -> CuboidCache:
        client = redis_client.connect(redis_cluster_url)
        client.flushdb(target_nodes=RedisCluster.PRIMARIES)  # type: ignore[call-arg]
        return RedisCuboidCache(client)

    def damage(self, cache: CuboidCache, name: str, number: int) -> None:
        flip_a_byte(cache._redis, name, number)  # type: ignore[attr-defined]


class TestMemoryCuboidCache(CuboidCacheContract):
    @pytest.fixture
    def locks(self) -> RWLocks | None:
        return LocalLocks(timeout_s=10)

    @pytest.fixture
    def cache(self, locks: LocalLocks) -> CuboidCache:
        return MemoryCuboidCache(locks)

    def damage(self, cache: CuboidCache, name: str, number: int) -> None:
        assert isinstance(cache, MemoryCuboidCache)
        cache.damage(name, number)


def test_lock_free_commits_are_the_adapters_own_capability(redis_url: str, redis_cluster_url: str) -> None:
    """Only a cache built with the locks that share its Redis offers them; locks in another Redis
    are refused; a Cluster never offers them (its scripts see one slot's keys)."""
    client = redis_client.connect(redis_url)
    assert RedisCuboidCache(client).lock_free is None
    assert RedisCuboidCache(client, RedisRWLocks(redis_client.connect(redis_url))).lock_free is not None
    other_db = redis_url.rsplit("/", 1)[0] + "/1"
    with pytest.raises(ValueError, match="own Redis"):
        RedisCuboidCache(client, RedisRWLocks(redis_client.connect(other_db)))
    cluster = redis_client.connect(redis_cluster_url)
    assert RedisCuboidCache(cluster, RedisRWLocks(cluster)).lock_free is None
    assert MemoryCuboidCache().lock_free is None and MemoryCuboidCache(LocalLocks()).lock_free is not None
