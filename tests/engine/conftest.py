"""Engine fixtures: a cache tier on the session's real redis-server (emptied per test) over a
file-store base tier in the test's own directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis

from ndstore.core.geometry import Box
from ndstore.engine.base_tier import BaseTier
from ndstore.engine.cache_tier import CacheTier
from ndstore.engine.direct import CoherentDirect
from ndstore.engine.volume import ChannelVolume
from ndstore.storage import redis_client
from ndstore.storage.filestore import FileObjectStore
from ndstore.storage.redis_cache import RedisCuboidCache
from ndstore.storage.rwlock import RedisRWLocks, lock_keys
from ndstore.storage.sqlite_index import SqliteSupercuboidIndex


def make_cache_tier(root: Path, redis_url: str, lock_free: bool = True) -> CacheTier:
    """`lock_free`: small requests skip the locks (the service's wiring, whose locks live in the
    cache's Redis); False: every request takes them."""
    objects, index = FileObjectStore(root / "objects", fsync=False), SqliteSupercuboidIndex(root / "index.db")
    objects.ensure_ready()
    index.ensure_ready()
    locks = RedisRWLocks(redis_client.connect(redis_url), timeout_s=30)
    base = BaseTier(objects, index, locks)
    tier = CacheTier(RedisCuboidCache(redis_client.connect(redis_url)), base, locks,
                     lock_keys=lock_keys if lock_free else None)
    tier.verify()  # as the service's start does: the Redis checked against its ledger, its run marked
    return tier


@pytest.fixture
def cache_tier(tmp_path: Path, redis_url: str) -> Iterator[CacheTier]:
    """Its page-ins that outlive their reads are stored before the next test empties the Redis."""
    redis.Redis.from_url(redis_url).flushdb()
    tier = make_cache_tier(tmp_path, redis_url)
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
