"""The one place where settings become adapters and adapters become engines.

Backends are registered by name; nothing else in the code base chooses between them.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from blaze.buffer import RedisBlazeBuffer
from blaze.merge import Merger
from blaze.tier import BlazeTier
from ndstore.config import Config
from ndstore.core.signing import Signer
from ndstore.engine.base_tier import BaseTier
from ndstore.engine.cache_tier import CacheTier
from ndstore.engine.direct import CoherentDirect
from ndstore.engine.downsample import Downsampler, DownsampleRuns
from ndstore.engine.ingest import Ingest
from ndstore.engine.volume import ChannelVolume, Cutout
from ndstore.engine.writeback import CacheManager, Flusher
from ndstore.storage import redis_client
from ndstore.storage.dynamodb import DynamoSupercuboidIndex
from ndstore.storage.filestore import FileObjectStore
from ndstore.storage.generation import RedisGeneration
from ndstore.storage.interfaces import ObjectStore, RWLocks, SupercuboidIndex
from ndstore.storage.lambda_triggers import LambdaTriggers
from ndstore.storage.locks import LocalLocks
from ndstore.storage.rate_limit import RedisRateLimiter
from ndstore.storage.redis_cache import RedisCuboidCache
from ndstore.storage.rwlock import RedisRWLocks
from ndstore.storage.s3 import S3ObjectStore
from ndstore.storage.sqlite_index import SqliteSupercuboidIndex
from ndstore.storage.sqs import SqsQueues
from ndstore.storage.tile_bucket import S3TileBucket
from ndstore.storage.tile_index import DynamoTileIndex

OBJECT_STORES: dict[str, Callable[[Config], ObjectStore]] = {
    "file": lambda c: FileObjectStore(c.objects_dir, c.io_parallelism, c.fsync),
    "s3": lambda c: S3ObjectStore(c.s3_bucket, c.s3_endpoint_url, c.aws_region, c.io_parallelism, c.aws_timeout_s),
}
INDEXES: dict[str, Callable[[Config], SupercuboidIndex]] = {
    "sqlite": lambda c: SqliteSupercuboidIndex(c.index_path),
    "dynamodb": lambda c: DynamoSupercuboidIndex(c.dynamodb_table, c.dynamodb_endpoint_url, c.aws_region,
                                                 c.aws_timeout_s),
}
LOCKS: dict[str, Callable[[Config], RWLocks]] = {
    "local": lambda c: LocalLocks(),
    "redis": lambda c: RedisRWLocks(redis_client.connect(c.redis_url), lease_ms=c.lock_lease_ms),
}


T = TypeVar("T")


def _pick(registry: Mapping[str, Callable[[Config], T]], kind: str, name: str) -> Callable[[Config], T]:
    try:
        return registry[name]
    except KeyError:
        raise ValueError(f"unknown {kind} backend {name!r}; known: {', '.join(sorted(registry))}") from None


class Tier(Protocol):
    def read(self, cutout: Cutout) -> Any: ...

    def write(self, cutout: Cutout, data: Any) -> None: ...


@dataclass(frozen=True)
class Services:
    config: Config
    objects: ObjectStore
    index: SupercuboidIndex
    base_tier: BaseTier
    cache_tier: CacheTier
    direct: CoherentDirect
    blaze_buffer: RedisBlazeBuffer
    blaze: BlazeTier
    merger: Merger

    def tier(self, path: str, access_mode: str) -> Tier:
        """The engine behind a cutout path ("cache", "direct" or "blaze") and access mode:
        `cache` reads through the cache (on the blaze path: base data plus pending NDBlaze
        writes); `no_cache` reads the base tier after writing back dirty data; `raw` reads the
        base tier as it is, skipping the cache, its dirty data and pending NDBlaze writes."""
        if access_mode == "raw":
            return self.base_tier
        if path == "blaze":
            return self.blaze
        if path == "direct" or access_mode == "no_cache":
            return self.direct
        return self.cache_tier

    @functools.cached_property
    def ingest(self) -> Ingest:
        """The ingest pipeline's state and phases; built on first use (it needs the ingest
        endpoints, which only the ingest paths use)."""
        c = self.config
        endpoint = c.ingest_endpoint_url
        functions = {phase: name for phase, name in (("supercuboid", c.ingest_supercuboid_function),
                                                     ("cleanup", c.ingest_cleanup_function)) if name}
        triggers = (LambdaTriggers(endpoint, c.aws_region), functions) if functions else None
        return Ingest(S3TileBucket(c.tile_bucket, endpoint, c.aws_region, c.io_parallelism,
                                   c.ingest_public_endpoint_url),
                      DynamoTileIndex(c.tile_index_table, endpoint, c.aws_region),
                      SqsQueues(endpoint, c.aws_region), self.direct, c.ingest_queue_prefix, c.ingest_visibility_s,
                      c.ingest_max_tries, Signer(c.secret_key, "ingest"), triggers)

    @functools.cached_property
    def downsampler(self) -> Downsampler:
        return Downsampler(self.direct, self.index)

    @functools.cached_property
    def downsample_runs(self) -> DownsampleRuns:
        """SQS-driven hierarchy builds: their queues and state live with the ingest pipeline's."""
        ingest, c = self.ingest, self.config
        trigger = (LambdaTriggers(c.ingest_endpoint_url, c.aws_region), c.downsample_function) \
            if c.downsample_function else None
        return DownsampleRuns(self.downsampler, ingest.index, ingest.queues, c.ingest_queue_prefix,
                              c.ingest_visibility_s, c.ingest_max_tries, Signer(c.secret_key, "downsample"), trigger)

    @functools.cached_property
    def rate_limiter(self) -> RedisRateLimiter:
        """Request counters on the locks' Redis, which every web node already shares."""
        return RedisRateLimiter(redis_client.connect(self.config.redis_url))

    def purge_channel(self, channel: ChannelVolume) -> int:
        """Delete every voxel of a channel: its pending NDBlaze writes first (so no merge can
        bring them back), then cached and stored supercuboids. Returns stored ones deleted."""
        self.merger.discard(channel.name_prefix)
        return self.cache_tier.purge(channel)

    def flusher(self) -> Flusher:
        c = self.config
        return Flusher(self.cache_tier, c.flush_age_s, c.flush_interval_s, c.flush_in_flight)

    def cache_manager(self) -> CacheManager:
        return CacheManager(self.cache_tier, self.config.cache_high_bytes, self.config.cache_low_bytes)


def build(config: Config) -> Services:
    objects = _pick(OBJECT_STORES, "object store", config.object_store)(config)
    index = _pick(INDEXES, "index", config.index)(config)
    locks = _pick(LOCKS, "lock", config.locks)(config)
    objects.ensure_ready()
    index.ensure_ready()
    base = BaseTier(objects, index, locks, config.io_parallelism)
    cache = CacheTier(RedisCuboidCache(redis_client.connect(config.cache_redis_url)), base, locks,
                      config.io_parallelism)
    direct = CoherentDirect(cache)
    # NDBlaze bodies reach 1 GiB: a write may take longer than redis-py's default 5 s timeout.
    buffer = RedisBlazeBuffer(redis_client.connect(config.blaze_redis_url, socket_timeout=300),
                              config.blaze_max_pending_bytes)
    return Services(config, objects, index, base, cache, direct, buffer, BlazeTier(buffer, direct),
                    Merger(buffer, cache))


_BUILDING = threading.Lock()


@functools.lru_cache(maxsize=1)
def services() -> Services:
    """The process-wide services, built on first use from the environment. The first requests of
    a threaded worker arrive together: one builds, the others wait for it and build nothing."""
    with _BUILDING:
        if services.cache_info().currsize:  # built while this thread waited for the lock
            return services()
        return build(Config())


@functools.lru_cache(maxsize=1)
def metadata_generation() -> RedisGeneration:
    """The metadata generation on the locks' Redis; built alone, without the storage services, as
    management commands that change metadata need nothing else."""
    return RedisGeneration(redis_client.connect(Config().redis_url))


_SERVICES: dict[tuple[tuple[str, str], ...], Services] = {}


def services_for_settings(settings: Mapping[str, str]) -> Services:
    """Services built from the NDSTORE_* settings a Spark driver sent with a task; one per
    distinct settings in this (reused) worker process."""
    key = tuple(sorted(settings.items()))
    if key not in _SERVICES:
        for name in [n for n in os.environ if n.startswith("NDSTORE_")]:
            del os.environ[name]
        os.environ.update(settings)
        _SERVICES[key] = build(Config())
    return _SERVICES[key]


def merger_for_settings(settings: Mapping[str, str]) -> Merger:
    return services_for_settings(settings).merger


def downsampler_for_settings(settings: Mapping[str, str]) -> Downsampler:
    return services_for_settings(settings).downsampler
