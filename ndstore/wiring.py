"""The one place where settings become adapters and adapters become engines.

Backends are registered by name; nothing else in the code base chooses between them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import redis

from ndstore.config import Config
from ndstore.engine.base_tier import BaseTier
from ndstore.storage.dynamodb import DynamoSupercuboidIndex
from ndstore.storage.filestore import FileObjectStore
from ndstore.storage.interfaces import ExclusiveLocks, ObjectStore, SupercuboidIndex
from ndstore.storage.locks import LocalLocks, RedisLocks
from ndstore.storage.s3 import S3ObjectStore
from ndstore.storage.sqlite_index import SqliteSupercuboidIndex

OBJECT_STORES: dict[str, Callable[[Config], ObjectStore]] = {
    "file": lambda c: FileObjectStore(c.objects_dir, c.io_parallelism, c.fsync),
    "s3": lambda c: S3ObjectStore(c.s3_bucket, c.s3_endpoint_url, c.aws_region, c.io_parallelism),
}
INDEXES: dict[str, Callable[[Config], SupercuboidIndex]] = {
    "sqlite": lambda c: SqliteSupercuboidIndex(c.index_path),
    "dynamodb": lambda c: DynamoSupercuboidIndex(c.dynamodb_table, c.dynamodb_endpoint_url, c.aws_region),
}
LOCKS: dict[str, Callable[[Config], ExclusiveLocks]] = {
    "local": lambda c: LocalLocks(),
    "redis": lambda c: RedisLocks(redis.Redis.from_url(c.redis_url)),
}


T = TypeVar("T")


def _pick(registry: Mapping[str, Callable[[Config], T]], kind: str, name: str) -> Callable[[Config], T]:
    try:
        return registry[name]
    except KeyError:
        raise ValueError(f"unknown {kind} backend {name!r}; known: {', '.join(sorted(registry))}") from None


@dataclass(frozen=True)
class Services:
    config: Config
    objects: ObjectStore
    index: SupercuboidIndex
    base_tier: BaseTier

    def tier(self, path: str, access_mode: str) -> BaseTier:
        """The engine behind a cutout path ("cache" or "direct") and access mode. Until the
        cache tier exists, every path reads and writes the base tier directly."""
        del path, access_mode
        return self.base_tier


def build(config: Config) -> Services:
    objects = _pick(OBJECT_STORES, "object store", config.object_store)(config)
    index = _pick(INDEXES, "index", config.index)(config)
    locks = _pick(LOCKS, "lock", config.locks)(config)
    objects.ensure_ready()
    index.ensure_ready()
    return Services(config, objects, index, BaseTier(objects, index, locks, config.io_parallelism))


@functools.lru_cache(maxsize=1)
def services() -> Services:
    """The process-wide services, built on first use from the environment."""
    return build(Config())
