"""Engine fixtures: a cache tier on the session's real redis-server (emptied per test) over a
file-store base tier in the test's own directory, and the same on the in-memory cuboid cache
(ndstore/testing/memory_cache.py) with in-process locks, for tests of the engine's own logic."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import redis

from ndstore import wiring
from ndstore.config import Config
from ndstore.core.geometry import Box
from ndstore.core.observe import NULL, Observer
from ndstore.engine.base_tier import BaseTier
from ndstore.engine.cache.tier import CacheTier
from ndstore.engine.direct import CoherentDirect
from ndstore.engine.volume import ChannelVolume
from ndstore.storage import redis_client
from ndstore.storage.filestore import FileObjectStore
from ndstore.storage.interfaces import CuboidCache, RWLocks
from ndstore.storage.locks import LocalLocks
from ndstore.storage.redis_cache import RedisCuboidCache
from ndstore.storage.rwlock import RedisRWLocks
from ndstore.storage.sqlite_index import SqliteSupercuboidIndex
from ndstore.testing.memory_cache import MemoryCuboidCache

Clock = Callable[[], float]


def make_cache_tier(root: Path, redis_url: str, lock_free: bool = True, observer: Observer = NULL,
                    clock: Clock = time.time) -> CacheTier:
    """`lock_free`: small requests skip the locks (the service's wiring, whose locks live in the
    cache's Redis); False: every request takes them."""
    locks = RedisRWLocks(redis_client.connect(redis_url), timeout_s=30)
    cache = RedisCuboidCache(redis_client.connect(redis_url), locks if lock_free else None)
    return _tier(root, cache, locks, observer, clock)


def make_memory_tier(root: Path, lock_free: bool = True, observer: Observer = NULL,
                     clock: Clock = time.time) -> CacheTier:
    """The cache tier on the in-memory cuboid cache and in-process locks (a tier of its own:
    nothing else shares its cache)."""
    locks = LocalLocks(timeout_s=30)
    return _tier(root, MemoryCuboidCache(locks if lock_free else None), locks, observer, clock)


def _tier(root: Path, cache: CuboidCache, locks: RWLocks, observer: Observer, clock: Clock) -> CacheTier:
    objects, index = FileObjectStore(root / "objects", fsync=False), SqliteSupercuboidIndex(root / "index.db")
    objects.ensure_ready()
    index.ensure_ready()
    tier = CacheTier(cache, BaseTier(objects, index, locks), locks, observer=observer, clock=clock)
    tier.loss.verify()  # as the service's start does: the cache checked against its ledger, its run marked
    return tier


@pytest.fixture
def cache_tier(tmp_path: Path, redis_url: str) -> Iterator[CacheTier]:
    """Its page-ins that outlive their reads are stored before the next test empties the Redis."""
    redis.Redis.from_url(redis_url).flushdb()
    tier = make_cache_tier(tmp_path, redis_url)
    yield tier
    tier.settle()


@pytest.fixture
def memory_tier(tmp_path: Path) -> Iterator[CacheTier]:
    """A cache tier on the in-memory cuboid cache: for what the engine itself does."""
    tier = make_memory_tier(tmp_path)
    yield tier
    tier.settle()


@pytest.fixture(params=["memory", "redis"])
def any_cache_tier(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CacheTier]:
    """The cache tier on each cuboid cache."""
    if request.param == "redis":
        redis_url = request.getfixturevalue("redis_url")
        redis.Redis.from_url(redis_url).flushdb()
        tier = make_cache_tier(tmp_path, redis_url)
    else:
        tier = make_memory_tier(tmp_path)
    yield tier
    tier.settle()


@pytest.fixture
def direct(cache_tier: CacheTier) -> CoherentDirect:
    return CoherentDirect(cache_tier)


def small_channel(dtype: str = "uint16", write_through: bool = False, cid: int = 1) -> ChannelVolume:
    """Two supercuboids wide in x and y, 1.5 in z, whatever the dtype."""
    probe = ChannelVolume(1, 1, cid, np.dtype(dtype), Box((0, 0, 0), (1, 1, 1)), 2, "anisotropic", 1)
    sc = probe.grid(0).supercuboid
    frame = Box((0, 0, 0), (2 * sc[0], 2 * sc[1], sc[2] + sc[2] // 2))
    return ChannelVolume(1, 1, cid, np.dtype(dtype), frame, 2, "anisotropic", 1, write_through)


@pytest.fixture
def svc(tmp_path: Path, redis_url: str, blaze_redis_url: str,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[wiring.Services]:
    """Services built by the wiring on the local default (a directory, SQLite files), real Redis."""
    redis.Redis.from_url(redis_url).flushdb()
    redis.Redis.from_url(blaze_redis_url).flushdb()
    settings = {"NDSTORE_DATA_DIR": str(tmp_path), "NDSTORE_OBJECT_STORE": "file", "NDSTORE_INDEX": "sqlite",
                "NDSTORE_LOCKS": "redis", "NDSTORE_REDIS_URL": redis_url, "NDSTORE_BLAZE_REDIS_URL": blaze_redis_url,
                "NDSTORE_FSYNC": "0", "NDSTORE_LOCK_LEASE_MS": "3000", "NDSTORE_SECRET_KEY": "engine-tests-secret-key"}
    for name in [n for n in os.environ if n.startswith("NDSTORE_")]:
        monkeypatch.delenv(name)
    services = wiring.build(Config.from_env(settings))
    services.cache_tier.loss.verify()
    services.blaze_ledger.verify()  # as the service's start does
    yield services
    services.close()
