"""NDBlaze fixtures: a buffer on its own real redis-server (emptied per test) in front of a
cache tier and file-store base tier (tests/engine/conftest.py); the same built by the wiring
from NDSTORE_* settings, which Spark workers receive too (`wired`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from blaze.merge import Merger
from blaze.tier import BlazeTier, buffer_ledger
from ndstore import wiring
from ndstore.config import Config
from ndstore.engine.base_tier import BaseTier
from ndstore.engine.cache.tier import CacheTier
from ndstore.engine.direct import CoherentDirect
from ndstore.storage import redis_client
from ndstore.storage.blaze_buffer import RedisBlazeBuffer, RedisMergeRequests, RedisMergerPresence
from tests.engine.conftest import make_cache_tier


@dataclass
class Blaze:
    buffer: RedisBlazeBuffer
    tier: BlazeTier
    merger: Merger
    cache_tier: CacheTier
    base: BaseTier  # the cache tier's, to look at the base tier alone
    requests: RedisMergeRequests
    presence: RedisMergerPresence
    config: Config | None = None  # the services' settings, where the wiring built them


def make_blaze(root: Path, redis_url: str, blaze_url: str, max_pending_bytes: int = 1 << 30) -> Blaze:
    cache_tier = make_cache_tier(root, redis_url)
    client = redis_client.connect(blaze_url)
    buffer = RedisBlazeBuffer(client, max_pending_bytes)
    ledger = buffer_ledger(buffer, cache_tier.loss)
    ledger.verify()  # as the service's start does
    return Blaze(buffer, BlazeTier(buffer, CoherentDirect(cache_tier), ledger), Merger(buffer, cache_tier), cache_tier,
                 cache_tier._base, RedisMergeRequests(client), RedisMergerPresence(client))


@pytest.fixture
def blaze(tmp_path: Path, redis_url: str, blaze_redis_url: str) -> Blaze:
    redis.Redis.from_url(redis_url).flushdb()
    redis.Redis.from_url(blaze_redis_url).flushdb()
    return make_blaze(tmp_path, redis_url, blaze_redis_url)


@pytest.fixture
def wired(tmp_path: Path, redis_url: str, blaze_redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Blaze:
    """Services built by the wiring from NDSTORE_* settings, which Spark workers receive too."""
    redis.Redis.from_url(redis_url).flushdb()
    redis.Redis.from_url(blaze_redis_url).flushdb()
    settings = {"NDSTORE_DATA_DIR": str(tmp_path), "NDSTORE_OBJECT_STORE": "file", "NDSTORE_INDEX": "sqlite",
                "NDSTORE_LOCKS": "redis", "NDSTORE_REDIS_URL": redis_url, "NDSTORE_BLAZE_REDIS_URL": blaze_redis_url,
                "NDSTORE_FSYNC": "0", "NDSTORE_LOCK_LEASE_MS": "3000"}
    for name in [n for n in os.environ if n.startswith("NDSTORE_")]:
        monkeypatch.delenv(name)
    for name, value in settings.items():
        monkeypatch.setenv(name, value)  # for `ndstore blaze merge` run in a process of its own
    svc = wiring.build(Config.from_env(settings))
    svc.blaze_ledger.verify()  # as the service's start does
    return Blaze(svc.blaze_buffer, svc.blaze, svc.merger, svc.cache_tier, svc.cache_tier._base, svc.merge_requests,
                 svc.merger_presence, svc.config)
