"""Every setting of the service, read once from environment variables (12-factor).

docs/deployment.md lists them with their defaults; keep the two in step.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

GiB = 1 << 30
RATE_PERIODS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600}


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def parse_rate(rate: str) -> tuple[int, int] | None:
    """`N/period` as (N, seconds); None for `0` or an empty setting (no limit)."""
    rate = rate.strip()
    if rate in ("", "0"):
        return None
    count, _, period = rate.partition("/")
    if not count.isdigit() or period not in RATE_PERIODS:
        raise ValueError(f"NDSTORE_ANON_READ_RATE must look like 3000/min (periods: s, min, hour), not {rate!r}")
    return (int(count), RATE_PERIODS[period]) if int(count) > 0 else None


@dataclass(frozen=True)
class Config:
    data_dir: Path = field(default_factory=lambda: Path(_env("NDSTORE_DATA_DIR", ".ndstore")).resolve())
    object_store: str = field(default_factory=lambda: _env("NDSTORE_OBJECT_STORE", "file"))
    s3_bucket: str = field(default_factory=lambda: _env("NDSTORE_S3_BUCKET", "ndstore-cuboids"))
    s3_endpoint_url: str | None = field(default_factory=lambda: os.environ.get("NDSTORE_S3_ENDPOINT_URL"))
    index: str = field(default_factory=lambda: _env("NDSTORE_INDEX", "sqlite"))
    dynamodb_table: str = field(default_factory=lambda: _env("NDSTORE_DYNAMODB_TABLE", "ndstore-supercuboid-index"))
    dynamodb_endpoint_url: str | None = field(default_factory=lambda: os.environ.get("NDSTORE_DYNAMODB_ENDPOINT_URL"))
    aws_region: str = field(default_factory=lambda: _env("AWS_DEFAULT_REGION", "us-east-1"))
    # connect and read timeout of each base-tier S3/DynamoDB attempt (unset: botocore's 60 s)
    aws_timeout_s: float | None = field(default_factory=lambda: float(os.environ["NDSTORE_AWS_TIMEOUT_S"])
                                        if os.environ.get("NDSTORE_AWS_TIMEOUT_S") else None)
    locks: str = field(default_factory=lambda: _env("NDSTORE_LOCKS", "redis"))
    redis_url: str = field(default_factory=lambda: _env("NDSTORE_REDIS_URL", "redis://127.0.0.1:6390/0"))
    cache_redis_url: str = field(default_factory=lambda: os.environ.get(
        "NDSTORE_CACHE_REDIS_URL", os.environ.get("NDSTORE_REDIS_URL", "redis://127.0.0.1:6390/0")))
    flush_age_s: float = field(default_factory=lambda: float(_env("NDSTORE_FLUSH_AGE_S", "5")))
    flush_interval_s: float = field(default_factory=lambda: float(_env("NDSTORE_FLUSH_INTERVAL_S", "1")))
    flush_in_flight: int = field(default_factory=lambda: int(_env("NDSTORE_FLUSH_IN_FLIGHT", "4")))
    cache_high_bytes: int = field(default_factory=lambda: int(_env("NDSTORE_CACHE_HIGH_BYTES", str(4 * GiB))))
    cache_low_bytes: int = field(default_factory=lambda: int(_env("NDSTORE_CACHE_LOW_BYTES", str(3 * GiB))))
    io_parallelism: int = field(default_factory=lambda: int(_env("NDSTORE_IO_PARALLELISM", "16")))
    max_body_bytes: int = field(default_factory=lambda: int(_env("NDSTORE_MAX_BODY_BYTES", str(GiB))))
    max_cutout_bytes: int = field(default_factory=lambda: int(_env("NDSTORE_MAX_CUTOUT_BYTES", str(GiB))))
    lock_lease_ms: int = field(default_factory=lambda: int(_env("NDSTORE_LOCK_LEASE_MS", "30000")))
    blaze_redis_url: str = field(default_factory=lambda: _env("NDSTORE_BLAZE_REDIS_URL", "redis://127.0.0.1:6391/0"))
    blaze_max_pending_bytes: int = field(
        default_factory=lambda: int(_env("NDSTORE_BLAZE_MAX_PENDING_BYTES", str(4 * GiB))))
    blaze_merge_interval_s: float = field(default_factory=lambda: float(_env("NDSTORE_BLAZE_MERGE_INTERVAL_S", "30")))
    blaze_merge_backlog_bytes: int = field(
        default_factory=lambda: int(_env("NDSTORE_BLAZE_MERGE_BACKLOG_BYTES", str(GiB))))
    spark_master: str = field(default_factory=lambda: _env("NDSTORE_SPARK_MASTER", "local[*]"))
    ingest_endpoint_url: str | None = field(default_factory=lambda: os.environ.get("NDSTORE_INGEST_ENDPOINT_URL"))
    # What /v1/ingest/ tells upload clients, where they reach the endpoint by another name.
    ingest_public_endpoint_url: str | None = field(
        default_factory=lambda: os.environ.get("NDSTORE_INGEST_PUBLIC_ENDPOINT_URL"))
    tile_bucket: str = field(default_factory=lambda: _env("NDSTORE_TILE_BUCKET", "ndstore-tiles"))
    tile_index_table: str = field(default_factory=lambda: _env("NDSTORE_TILE_INDEX_TABLE", "ndstore-tile-index"))
    ingest_queue_prefix: str = field(default_factory=lambda: _env("NDSTORE_INGEST_QUEUE_PREFIX", "ndstore-ingest"))
    ingest_visibility_s: int = field(default_factory=lambda: int(_env("NDSTORE_INGEST_VISIBILITY_S", "60")))
    ingest_max_tries: int = field(default_factory=lambda: int(_env("NDSTORE_INGEST_MAX_TRIES", "3")))
    ingest_notify_queue: bool = field(default_factory=lambda: _env("NDSTORE_INGEST_NOTIFY_QUEUE", "1") == "1")
    ingest_supercuboid_function: str = field(default_factory=lambda: _env("NDSTORE_INGEST_SUPERCUBOID_FUNCTION", ""))
    ingest_cleanup_function: str = field(default_factory=lambda: _env("NDSTORE_INGEST_CLEANUP_FUNCTION", ""))
    downsample_function: str = field(default_factory=lambda: _env("NDSTORE_DOWNSAMPLE_FUNCTION", ""))
    ingest_workers: int = field(default_factory=lambda: int(_env("NDSTORE_INGEST_WORKERS", "2")))
    anon_read_rate: str = field(default_factory=lambda: _env("NDSTORE_ANON_READ_RATE", "3000/min"))
    fsync: bool = field(default_factory=lambda: _env("NDSTORE_FSYNC", "1") == "1")
    # signs what the ingest and downsample handlers trust (ndstore.core.signing); Django's key too
    secret_key: str = field(default_factory=lambda: _env("NDSTORE_SECRET_KEY", ""), repr=False)

    def __post_init__(self) -> None:
        self.anon_read_limit  # noqa: B018  parsed once: a malformed rate stops the service at start

    @functools.cached_property
    def anon_read_limit(self) -> tuple[int, int] | None:
        """NDSTORE_ANON_READ_RATE as (requests, seconds); None: no limit."""
        return parse_rate(self.anon_read_rate)

    @property
    def objects_dir(self) -> Path:
        return self.data_dir / "objects"

    @property
    def index_path(self) -> Path:
        return self.data_dir / "index.sqlite3"
