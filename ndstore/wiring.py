"""The one place where settings become adapters and adapters become engines.

Backends are registered by name; nothing else in the code base chooses between them. A Config
comes in (built at the edge: `Config.from_env()`); nothing here reads the environment.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from blaze.merge import Merger
from blaze.tier import BlazeTier, buffer_ledger
from ndstore.config import Config
from ndstore.core.observe import Observer
from ndstore.core.signing import Signer
from ndstore.engine.base_tier import BaseTier
from ndstore.engine.cache.daemons import CacheManager, Flusher
from ndstore.engine.cache.tier import CacheTier
from ndstore.engine.cost import ByteBudget, largest_write
from ndstore.engine.dataplane import DataPlane
from ndstore.engine.direct import CoherentDirect
from ndstore.engine.downsample import Downsampler, DownsampleRuns
from ndstore.engine.index_check import GuardedIndex
from ndstore.engine.ingest import Ingest
from ndstore.engine.label_index import LabelKeeper
from ndstore.engine.ledger import LedgerKeeper
from ndstore.engine.levels import StoredLevels
from ndstore.engine.segments.builders import product_builders
from ndstore.engine.segments.fragments import Fragments
from ndstore.engine.segments.upkeep import ProductQueue, ProductUpkeep
from ndstore.storage import redis_client
from ndstore.storage.aws import Credentials
from ndstore.storage.blaze_buffer import RedisBlazeBuffer, RedisMergeRequests, RedisMergerPresence
from ndstore.storage.dynamodb import DynamoSupercuboidIndex
from ndstore.storage.dynamodb_label_index import DynamoLabelIndex
from ndstore.storage.filestore import FileObjectStore
from ndstore.storage.generation import RedisGeneration
from ndstore.storage.interfaces import (
    JobState,
    LabelIndex,
    ObjectStore,
    RWLocks,
    SupercuboidIndex,
    TileStore,
    Triggers,
    WorkQueue,
)
from ndstore.storage.job_state import DynamoJobState
from ndstore.storage.lambda_triggers import LambdaTriggers
from ndstore.storage.local_tiles import LocalTileStore
from ndstore.storage.locks import LocalLocks
from ndstore.storage.rate_limit import RedisRateLimiter
from ndstore.storage.redis_cache import RedisCuboidCache
from ndstore.storage.redis_metrics import RedisMetrics
from ndstore.storage.rwlock import RedisRWLocks
from ndstore.storage.s3 import S3ObjectStore
from ndstore.storage.sqlite_index import SqliteSupercuboidIndex
from ndstore.storage.sqlite_job_state import SqliteJobState
from ndstore.storage.sqlite_label_index import SqliteLabelIndex
from ndstore.storage.sqlite_queue import SqliteQueues
from ndstore.storage.sqs import SqsQueues
from ndstore.storage.tile_bucket import S3TileBucket

log = logging.getLogger(__name__)


def credentials(c: Config) -> Credentials | None:
    """The Config's AWS credentials, when it carries them (else boto3's own chain)."""
    if c.aws_access_key_id and c.aws_secret_access_key:
        return Credentials(c.aws_access_key_id, c.aws_secret_access_key, c.aws_session_token)
    return None


OBJECT_STORES: dict[str, Callable[[Config], ObjectStore]] = {
    "file": lambda c: FileObjectStore(c.objects_dir, c.io_parallelism, c.fsync),
    "s3": lambda c: S3ObjectStore(c.s3_bucket, c.s3_endpoint_url, c.aws_region, c.io_parallelism, c.aws_timeout_s,
                                  credentials(c), c.s3_part_bytes, c.s3_multipart_threshold),
}
INDEXES: dict[str, Callable[[Config], SupercuboidIndex]] = {
    "sqlite": lambda c: SqliteSupercuboidIndex(c.index_path),
    "dynamodb": lambda c: DynamoSupercuboidIndex(c.dynamodb_table, c.dynamodb_endpoint_url, c.aws_region,
                                                 c.aws_timeout_s, credentials(c)),
}
LABEL_INDEXES: dict[str, Callable[[Config], LabelIndex | None]] = {
    "sqlite": lambda c: SqliteLabelIndex(c.label_index_path),
    "dynamodb": lambda c: DynamoLabelIndex(c.label_table, c.dynamodb_endpoint_url, c.aws_region, c.aws_timeout_s,
                                           credentials(c)),
    "off": lambda c: None,
}
LOCKS: dict[str, Callable[[Config, Observer], RWLocks]] = {
    "local": lambda c, o: LocalLocks(),
    "redis": lambda c, o: RedisRWLocks(redis_client.connect(c.redis_url, c.redis_timeout_s), lease_ms=c.lock_lease_ms,
                                       observer=o),
}


@dataclass(frozen=True)
class IngestStores:
    """The ingest pipeline's (and the downsample runs') queues, tile store, job state and triggers."""

    queues: WorkQueue
    tiles: TileStore
    state: JobState
    triggers: Triggers | None  # None: the local runner polls the queues (no Lambda)
    uploads: LocalTileStore | None  # the store the service's tile-upload route writes, if it has one


def _local_ingest(c: Config) -> IngestStores:
    """SQLite queues and job state and a tile directory under the data dir: what `ndstore up`
    runs, durable across its restarts. Uploads come through the service's own route."""
    queues = SqliteQueues(c.ingest_dir / "queues.sqlite3")
    tiles = LocalTileStore(c.ingest_dir / "tiles", c.ingest_public_endpoint_url or "http://127.0.0.1:8000",
                           Signer(c.secret_key, "tile-upload"), queues, c.tile_bucket, c.fsync)
    return IngestStores(queues, tiles, SqliteJobState(c.ingest_dir / "state.sqlite3"), None, tiles)


def _aws_ingest(c: Config) -> IngestStores:
    """SQS, S3 and DynamoDB (AWS, or an endpoint that speaks them); Lambda triggers when functions
    are named."""
    endpoint, creds = c.ingest_endpoint_url, credentials(c)
    functions = c.ingest_supercuboid_function or c.ingest_cleanup_function or c.downsample_function
    return IngestStores(SqsQueues(endpoint, c.aws_region, creds),
                        S3TileBucket(c.tile_bucket, endpoint, c.aws_region, c.io_parallelism,
                                     c.ingest_public_endpoint_url, creds),
                        DynamoJobState(c.tile_index_table, endpoint, c.aws_region, creds),
                        LambdaTriggers(endpoint, c.aws_region, creds) if functions else None, None)


INGEST_BACKENDS: dict[str, Callable[[Config], IngestStores]] = {"local": _local_ingest, "aws": _aws_ingest}


T = TypeVar("T")


def _pick(registry: Mapping[str, T], kind: str, name: str) -> T:
    try:
        return registry[name]
    except KeyError:
        raise ValueError(f"unknown {kind} backend {name!r}; known: {', '.join(sorted(registry))}") from None


@dataclass(frozen=True)
class Services:
    config: Config
    objects: ObjectStore  # the base tier's store (supercuboids, ledgers, the index's stale mark)
    index: GuardedIndex  # refuses to list a volume while marked stale (ndstore/engine/index_check.py)
    labels: LabelKeeper | None  # the label index of label channels; None when it is off
    locks: RWLocks  # shared leases; the cache tier's supercuboid locks are its own business
    metrics: RedisMetrics  # what every process counts, for /metrics (the engine's Observer)
    cache_tier: CacheTier
    direct: CoherentDirect  # the pipelines' (ingest, downsampling) way to the base tier
    plane: DataPlane  # the front door of every request that reads or writes voxels
    blaze_buffer: RedisBlazeBuffer
    merge_requests: RedisMergeRequests
    merger_presence: RedisMergerPresence
    blaze: BlazeTier
    merger: Merger
    blaze_ledger: LedgerKeeper  # what the NDBlaze Redis holds unmerged, kept next to the base tier
    # each part the service needs, by name, and a call that fails unless it answers (/healthz)
    probes: Mapping[str, Callable[[], object]]
    products: ProductUpkeep | None = None  # label channels' segmentation products; None with no label index

    def close(self) -> None:
        """Stop what runs in the background for these services and talks to their servers: the
        metrics are flushed and no longer flushed by the process's flusher thread."""
        self.metrics.close()

    @functools.cached_property
    def ingest_stores(self) -> IngestStores:
        """Built on first use: only the ingest and downsample paths need them."""
        return _pick(INGEST_BACKENDS, "ingest", self.config.ingest_backend or "local")(self.config)

    @functools.cached_property
    def ingest(self) -> Ingest:
        """The ingest pipeline's state and phases."""
        c, stores = self.config, self.ingest_stores
        functions = {phase: name for phase, name in (("supercuboid", c.ingest_supercuboid_function),
                                                     ("cleanup", c.ingest_cleanup_function)) if name}
        triggers = (stores.triggers, functions) if stores.triggers and functions else None
        return Ingest(stores.tiles, stores.state, stores.queues, self.direct, c.ingest_queue_prefix,
                      c.ingest_visibility_s, c.ingest_max_tries, Signer(c.secret_key, "ingest"), self.locks, triggers)

    @functools.cached_property
    def fragments(self) -> Fragments:
        """The stored fragments of label channels' segmentation products."""
        return self.products.fragments if self.products else Fragments(self.objects, self.labels)


    @functools.cached_property
    def downsampler(self) -> Downsampler:
        return Downsampler(self.direct, self.index)

    @functools.cached_property
    def downsample_runs(self) -> DownsampleRuns:
        """Queue-driven hierarchy builds: their queues and state live with the ingest pipeline's."""
        c, stores = self.config, self.ingest_stores
        trigger = (stores.triggers, c.downsample_function) if stores.triggers and c.downsample_function else None
        return DownsampleRuns(self.downsampler, stores.state, stores.queues, c.ingest_queue_prefix,
                              c.ingest_visibility_s, c.ingest_max_tries, Signer(c.secret_key, "downsample"),
                              self.plane.levels, trigger)

    @functools.cached_property
    def rate_limiter(self) -> RedisRateLimiter:
        """Request counters on the locks' Redis, which every web node already shares."""
        return RedisRateLimiter(redis_client.connect(self.config.redis_url, self.config.redis_timeout_s))

    def flusher(self) -> Flusher:
        c = self.config
        return Flusher(self.cache_tier, c.flush_age_s, c.flush_interval_s, c.flush_in_flight, self.metrics)

    def cache_manager(self) -> CacheManager:
        c = self.config
        return CacheManager(self.cache_tier, c.cache_high_bytes, c.cache_low_bytes, observer=self.metrics)


def build(config: Config) -> Services:
    metrics = RedisMetrics(redis_client.connect(config.redis_url, config.redis_timeout_s))
    objects = _pick(OBJECT_STORES, "object store", config.object_store)(config)
    index = GuardedIndex(_pick(INDEXES, "index", config.index)(config), objects)
    locks = _pick(LOCKS, "lock", config.locks)(config, metrics)
    objects.ensure_ready()
    index.ensure_ready()
    labels = _label_keeper(config)
    products = None if labels is None else ProductUpkeep(
        objects, Fragments(objects, labels), labels, locks, None, product_builders(),
        functools.partial(_products_queue, config), functools.partial(Signer, config.secret_key, "segments"),
        metrics)
    base = BaseTier(objects, index, locks, config.io_parallelism, config.read_window_bytes, labels, products)
    cache_url = config.cache_redis_url or config.redis_url
    # small reads and writes skip the locks when the locks' keys live in the cache's Redis: the
    # cache adapter, told so, offers lock-free commits (RedisCuboidCache.lock_free)
    shared = locks if isinstance(locks, RedisRWLocks) and cache_url == config.redis_url else None
    cache_redis = redis_client.connect(cache_url, config.redis_timeout_s)
    cache = CacheTier(RedisCuboidCache(cache_redis, shared), base, locks, config.io_parallelism, observer=metrics)
    direct = CoherentDirect(cache)
    blaze_redis = redis_client.connect(config.blaze_redis_url, config.redis_timeout_s)
    # NDBlaze bodies reach 1 GiB: the answer to a large append waits for Redis to fsync it
    buffer = RedisBlazeBuffer(blaze_redis, config.blaze_max_pending_bytes,
                              redis_client.connect(config.blaze_redis_url, config.redis_bulk_timeout_s))
    blaze_ledger = buffer_ledger(buffer, cache.loss, metrics)
    probe_timeout = min(2.0, config.redis_timeout_s)
    probes: dict[str, Callable[[], object]] = {
        "cache_redis": redis_client.connect(cache_url, probe_timeout).ping,
        "lock_redis": redis_client.connect(config.redis_url, probe_timeout).ping,
        "blaze_redis": redis_client.connect(config.blaze_redis_url, probe_timeout).ping,
        "object_store": objects.ensure_ready, "index": index.ensure_ready,
        **({"label_index": labels.index.ensure_ready} if labels else {}),
    }
    blaze = BlazeTier(buffer, direct, blaze_ledger)
    budget = ByteBudget(config.worker_bytes_in_flight or largest_write(config.max_cutout_bytes,
                                                                       config.read_window_bytes),
                        config.anon_bytes_in_flight)
    plane = DataPlane(cache, blaze, index, StoredLevels(objects), budget, config.read_window_bytes, labels)
    if products is not None:
        products.plane = plane  # a rebuild reads what the base tier holds, through the front door
    return Services(config, objects, index, labels, locks, metrics, cache, direct, plane, buffer,
                    RedisMergeRequests(blaze_redis), RedisMergerPresence(blaze_redis), blaze, Merger(buffer, cache),
                    blaze_ledger, probes, products)


def _products_queue(config: Config) -> ProductQueue:
    """The queue of product rebuilds, among the ingest pipeline's queues (their stores are built
    on first use: most processes never write a label channel)."""
    stores = _pick(INGEST_BACKENDS, "ingest", config.ingest_backend or "local")(config)
    return ProductQueue(stores.queues, f"{config.ingest_queue_prefix}-seg", config.ingest_visibility_s,
                        config.ingest_max_tries)


def _label_keeper(config: Config) -> LabelKeeper | None:
    """The label index made ready, or None when it is off. A damaged SQLite file set aside leaves
    an empty index, which serves no channel until `ndstore reindex --labels`: said in one line."""
    index = _pick(LABEL_INDEXES, "label index", config.label_backend)(config)
    if index is None:
        return None
    found = index.ensure_ready()
    if found is not None:
        log.warning("LABEL INDEX SET ASIDE: %s; ids and boundingbox read voxels until an operator runs "
                    "`ndstore reindex --labels`", found)
    return LabelKeeper(index)


class _BuiltOnce:
    """A process's services, built by the first caller while the others wait for it and build
    nothing. (functools.lru_cache stores its result only after the function returned, i.e. after
    a lock taken inside it was released: a thread that took the lock in between built again.)"""

    def __init__(self, make: Callable[[], Services]):
        self._make = make
        self._built: Services | None = None
        self._lock = threading.Lock()

    def __call__(self) -> Services:
        built = self._built
        if built is not None:
            return built
        with self._lock:
            if self._built is None:
                self._built = self._make()
            return self._built

    @property
    def built(self) -> bool:
        return self._built is not None

    def cache_clear(self) -> None:
        """Forget the services: the next call builds them again (tests, after changing the
        environment). The services forgotten are closed (Services.close)."""
        with self._lock:
            built, self._built = self._built, None
        if built is not None:
            built.close()


# The process-wide services, built on first use from this process's environment (the edge: web
# workers, handlers, daemons). The first requests of a threaded worker arrive together.
services = _BuiltOnce(lambda: build(Config.from_env()))


def build_in_background() -> threading.Thread:
    """Build this process's services() now, in a thread of its own, so that a web worker's first
    request does not wait for them: with S3 and DynamoDB the build takes ~0.2-0.3 s (boto3's
    clients, the bucket's and the table's checks). Requests that arrive meanwhile wait for this
    build as they would for another request's. A failure is logged and met again by the first
    request (services() keeps no failed build)."""

    def run() -> None:
        try:
            services()
        except Exception as exc:  # noqa: BLE001 - whatever it is, the first request meets it again
            log.warning("services not built at start (the first request builds them): %s: %s",
                        type(exc).__name__, exc)

    thread = threading.Thread(target=run, name="ndstore-services-build", daemon=True)
    thread.start()
    return thread


def merger_announced(blaze_redis_url: str) -> bool:
    """Whether an NDBlaze merger has announced itself on that Redis (a supervisor's readiness check)."""
    with redis_client.connect(blaze_redis_url, 2.0) as client:
        return RedisMergerPresence(client).merger() is not None


@functools.lru_cache(maxsize=1)
def metadata_generation() -> RedisGeneration:
    """The metadata generation on the locks' Redis; built alone, without the storage services, as
    management commands that change metadata need nothing else."""
    config = Config.from_env()
    return RedisGeneration(redis_client.connect(config.redis_url, config.redis_timeout_s))


_SERVICES: dict[Config, Services] = {}


def services_for(config: Config) -> Services:
    """Services built from the Config a Spark driver sent with a task; one per distinct Config
    in this (reused) worker process."""
    if config not in _SERVICES:
        _SERVICES[config] = build(config)
    return _SERVICES[config]


def merger_for(config: Config) -> Merger:
    return services_for(config).merger


def downsampler_for(config: Config) -> Downsampler:
    return services_for(config).downsampler


def products_for(config: Config) -> ProductUpkeep:
    products = services_for(config).products
    if products is None:
        raise RuntimeError("segmentation products need the label index (NDSTORE_LABEL_BACKEND)")
    return products
