"""Every setting of the service: a value, built once at the edge from environment variables
(`Config.from_env()`: the web app's settings, each daemon's and handler's entry point) and passed
in from there, to the Spark tasks and the Lambda handlers too. Nothing below reads the
environment.

docs/deployment.md lists the settings with their defaults; keep the two in step.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

MiB = 1 << 20
GiB = 1 << 30
RATE_PERIODS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600}


def _env(name: str, default: Any, parse: Callable[[str], Any] = str, secret: bool = False) -> Any:
    """A setting read from environment variable `name` by Config.from_env; `default` when unset.
    A secret is left out of the Config's repr (logs, tracebacks)."""
    return field(default=default, metadata={"env": name, "parse": parse}, repr=not secret)


def _flag(raw: str) -> bool:
    return raw.strip().lower() in ("1", "true", "yes", "on")


def _optional(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    return lambda raw: parse(raw) if raw.strip() else None


def parse_rate(rate: str) -> tuple[int, int] | None:
    """`N/period` as (N, seconds); None for `0` or an empty setting (no limit)."""
    rate = rate.strip()
    if rate in ("", "0"):
        return None
    count, _, period = rate.partition("/")
    if not (count.isascii() and count.isdigit()) or period not in RATE_PERIODS:
        raise ValueError(f"NDSTORE_ANON_READ_RATE must look like 3000/min (periods: s, min, hour), not {rate!r}")
    return (int(count), RATE_PERIODS[period]) if int(count) > 0 else None


def _s3_part_bytes(raw: str) -> int:
    """0 (whole objects) or at least 5 MiB: S3 refuses smaller parts of a multipart upload."""
    value = int(raw)
    if value != 0 and value < 5 * MiB:
        raise ValueError(f"a part must be 0 (whole objects) or at least {5 * MiB} bytes (5 MiB), not {value}")
    return value


@dataclass(frozen=True)
class Config:
    data_dir: Path = _env("NDSTORE_DATA_DIR", Path(".ndstore"), Path)
    object_store: str = _env("NDSTORE_OBJECT_STORE", "file")
    s3_bucket: str = _env("NDSTORE_S3_BUCKET", "ndstore-cuboids")
    s3_endpoint_url: str | None = _env("NDSTORE_S3_ENDPOINT_URL", None)
    index: str = _env("NDSTORE_INDEX", "sqlite")
    dynamodb_table: str = _env("NDSTORE_DYNAMODB_TABLE", "ndstore-supercuboid-index")
    dynamodb_endpoint_url: str | None = _env("NDSTORE_DYNAMODB_ENDPOINT_URL", None)
    # the label index of label channels (docs/design/label-index.md): its backend, empty for the
    # index's own (sqlite: labels.sqlite3 beside index.sqlite3; dynamodb: the table below, empty
    # for `<NDSTORE_DYNAMODB_TABLE>-labels`), or `off` (ids and boundingbox then scan voxels)
    label_index: str = _env("NDSTORE_LABEL_INDEX", "")
    label_index_table: str = _env("NDSTORE_LABEL_INDEX_TABLE", "")
    aws_region: str = _env("AWS_DEFAULT_REGION", "us-east-1")
    # connect and read timeout of each base-tier S3/DynamoDB attempt (empty: botocore's 60 s)
    aws_timeout_s: float | None = _env("NDSTORE_AWS_TIMEOUT_S", 10.0, _optional(float))
    locks: str = _env("NDSTORE_LOCKS", "redis")
    # every Redis call (connect, send, each read) gives up after this; a server that made one wait
    # that long is marked stalled and later calls to it fail at once (ndstore/core/stalls.py)
    redis_timeout_s: float = _env("NDSTORE_REDIS_TIMEOUT_S", 3.0, float)
    # every query to a PostgreSQL metadata database, and every connect to it (ndstore/api/postgres)
    db_timeout_s: float = _env("NDSTORE_DB_TIMEOUT_S", 3.0, float)
    # the same for an NDBlaze write of more than 16 MiB, whose answer waits for its AOF fsync
    redis_bulk_timeout_s: float = _env("NDSTORE_REDIS_BULK_TIMEOUT_S", 60.0, float)
    redis_url: str = _env("NDSTORE_REDIS_URL", "redis://127.0.0.1:6390/0")
    cache_redis_url: str | None = _env("NDSTORE_CACHE_REDIS_URL", None)  # None: redis_url
    flush_age_s: float = _env("NDSTORE_FLUSH_AGE_S", 5.0, float)
    flush_interval_s: float = _env("NDSTORE_FLUSH_INTERVAL_S", 1.0, float)
    flush_in_flight: int = _env("NDSTORE_FLUSH_IN_FLIGHT", 4, int)
    cache_high_bytes: int = _env("NDSTORE_CACHE_HIGH_BYTES", 4 * GiB, int)
    cache_low_bytes: int = _env("NDSTORE_CACHE_LOW_BYTES", 3 * GiB, int)
    io_parallelism: int = _env("NDSTORE_IO_PARALLELISM", 16, int)
    # S3 objects are read in parallel ranged GETs of this size (0: one whole GET), and uploaded in
    # parallel parts of this size when larger than s3_multipart_threshold (0: never, one PUT);
    # see ndstore/storage/s3.py
    s3_part_bytes: int = _env("NDSTORE_S3_PART_BYTES", 8 * MiB, _s3_part_bytes)
    s3_multipart_threshold: int = _env("NDSTORE_S3_MULTIPART_THRESHOLD", 0, int)
    # raw bytes of supercuboids a large read fetches and decodes, or a base-tier write stores, at once
    # (engine/base_tier.py)
    read_window_bytes: int = _env("NDSTORE_READ_WINDOW_BYTES", 64 * 1024 * 1024, int)
    max_body_bytes: int = _env("NDSTORE_MAX_BODY_BYTES", GiB, int)
    max_cutout_bytes: int = _env("NDSTORE_MAX_CUTOUT_BYTES", GiB, int)
    # what one web worker process may hold for data requests at once (ndstore/engine/cost.py);
    # None: room for the largest write (4 x NDSTORE_MAX_CUTOUT_BYTES)
    worker_bytes_in_flight: int | None = _env("NDSTORE_WORKER_BYTES_IN_FLIGHT", None, int)
    # the part of it anonymous requests may hold together; also the most one of them may cost
    anon_bytes_in_flight: int = _env("NDSTORE_ANON_BYTES_IN_FLIGHT", 512 * 1024 * 1024, int)
    lock_lease_ms: int = _env("NDSTORE_LOCK_LEASE_MS", 30000, int)
    blaze_redis_url: str = _env("NDSTORE_BLAZE_REDIS_URL", "redis://127.0.0.1:6391/0")
    blaze_max_pending_bytes: int = _env("NDSTORE_BLAZE_MAX_PENDING_BYTES", 4 * GiB, int)
    blaze_merge_interval_s: float = _env("NDSTORE_BLAZE_MERGE_INTERVAL_S", 30.0, float)
    blaze_merge_backlog_bytes: int = _env("NDSTORE_BLAZE_MERGE_BACKLOG_BYTES", GiB, int)
    spark_master: str = _env("NDSTORE_SPARK_MASTER", "local[*]")
    # the ingest pipeline's queues, tile store and job state: `local` (SQLite and a directory under
    # data_dir: the default) or `aws` (SQS, S3, DynamoDB at ingest_endpoint_url, or AWS itself)
    ingest_backend: str | None = _env("NDSTORE_INGEST_BACKEND", None)  # None: aws if an endpoint is set
    ingest_endpoint_url: str | None = _env("NDSTORE_INGEST_ENDPOINT_URL", None)
    # Where upload clients reach the tile store, when not as the service does: the S3 endpoint in
    # presigned PUTs (aws), or the service's own base URL (local).
    ingest_public_endpoint_url: str | None = _env("NDSTORE_INGEST_PUBLIC_ENDPOINT_URL", None)
    tile_bucket: str = _env("NDSTORE_TILE_BUCKET", "ndstore-tiles")
    tile_index_table: str = _env("NDSTORE_TILE_INDEX_TABLE", "ndstore-tile-index")
    ingest_queue_prefix: str = _env("NDSTORE_INGEST_QUEUE_PREFIX", "ndstore-ingest")
    ingest_visibility_s: int = _env("NDSTORE_INGEST_VISIBILITY_S", 60, int)
    ingest_max_tries: int = _env("NDSTORE_INGEST_MAX_TRIES", 3, int)
    ingest_notify_queue: bool = _env("NDSTORE_INGEST_NOTIFY_QUEUE", True, _flag)
    ingest_supercuboid_function: str = _env("NDSTORE_INGEST_SUPERCUBOID_FUNCTION", "")
    ingest_cleanup_function: str = _env("NDSTORE_INGEST_CLEANUP_FUNCTION", "")
    downsample_function: str = _env("NDSTORE_DOWNSAMPLE_FUNCTION", "")
    ingest_workers: int = _env("NDSTORE_INGEST_WORKERS", 2, int)
    anon_read_rate: str = _env("NDSTORE_ANON_READ_RATE", "3000/min")
    # what one caller's data GETs may read, counted in the bytes each one reads to make its whole
    # answer (a Range of it costs the same): a rate per second and a burst, anonymous callers per
    # client address, authenticated ones per user (ndstore/api/throttling.py); a rate of 0: no limit
    anon_read_bytes_per_s: int = _env("NDSTORE_ANON_READ_BYTES_PER_S", 128 * MiB, int)
    anon_read_bytes_burst: int = _env("NDSTORE_ANON_READ_BYTES_BURST", GiB, int)
    read_bytes_per_s: int = _env("NDSTORE_READ_BYTES_PER_S", 4 * GiB, int)
    read_bytes_burst: int = _env("NDSTORE_READ_BYTES_BURST", 64 * GiB, int)
    fsync: bool = _env("NDSTORE_FSYNC", True, _flag)
    # signs what the ingest and downsample handlers trust (ndstore.core.signing); Django's key too
    secret_key: str = _env("NDSTORE_SECRET_KEY", "", secret=True)
    # the AWS credentials the service's own processes use, where the environment gives them (else
    # boto3's usual chain: instance or task roles); Spark tasks carry them with the Config
    aws_access_key_id: str | None = _env("AWS_ACCESS_KEY_ID", None, secret=True)
    aws_secret_access_key: str | None = _env("AWS_SECRET_ACCESS_KEY", None, secret=True)
    aws_session_token: str | None = _env("AWS_SESSION_TOKEN", None, secret=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir).resolve())
        if self.cache_redis_url is None:
            object.__setattr__(self, "cache_redis_url", self.redis_url)
        if self.ingest_backend is None:
            object.__setattr__(self, "ingest_backend", "aws" if self.ingest_endpoint_url else "local")
        self.anon_read_limit  # noqa: B018  parsed once: a malformed rate stops the service at start
        if self.s3_multipart_threshold and not self.s3_part_bytes:
            raise ValueError("NDSTORE_S3_MULTIPART_THRESHOLD needs NDSTORE_S3_PART_BYTES (the size of its parts), "
                             "not 0")
        for who in ("anon_read_bytes", "read_bytes"):
            if getattr(self, f"{who}_per_s") < 0 or getattr(self, f"{who}_burst") <= 0:
                raise ValueError(f"NDSTORE_{who.upper()}_PER_S must be 0 (no limit) or more, and "
                                 f"NDSTORE_{who.upper()}_BURST more than 0")
        if self.s3_multipart_threshold < 0:
            raise ValueError(f"NDSTORE_S3_MULTIPART_THRESHOLD must be 0 (never) or a size in bytes, "
                             f"not {self.s3_multipart_threshold}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Config:
        """The settings `environ` (default: this process's environment) gives; defaults for the rest.
        A value that does not parse stops here, naming the variable."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            name = f.metadata.get("env")
            if name is None or name not in env:
                continue
            try:
                values[f.name] = f.metadata["parse"](env[name])
            except ValueError as exc:
                raise ValueError(f"{name}={env[name]!r} is not a valid setting: {exc}") from None
        return cls(**values)

    def with_changes(self, **changes: Any) -> Config:
        return replace(self, **changes)

    @functools.cached_property
    def anon_read_limit(self) -> tuple[int, int] | None:
        """NDSTORE_ANON_READ_RATE as (requests, seconds); None: no limit."""
        return parse_rate(self.anon_read_rate)

    def read_budget(self, anonymous: bool) -> tuple[int, int] | None:
        """(bytes per second, burst) a caller's data GETs may read; None: no limit."""
        per_s, burst = ((self.anon_read_bytes_per_s, self.anon_read_bytes_burst) if anonymous
                        else (self.read_bytes_per_s, self.read_bytes_burst))
        return (per_s, burst) if per_s else None

    @property
    def objects_dir(self) -> Path:
        return self.data_dir / "objects"

    @property
    def index_path(self) -> Path:
        return self.data_dir / "index.sqlite3"

    @property
    def label_index_path(self) -> Path:
        return self.data_dir / "labels.sqlite3"

    @property
    def label_backend(self) -> str:
        """The label index's backend: NDSTORE_LABEL_INDEX, or the supercuboid index's."""
        return self.label_index or self.index

    @property
    def label_table(self) -> str:
        return self.label_index_table or f"{self.dynamodb_table}-labels"

    @property
    def ingest_dir(self) -> Path:
        """The local ingest backend's queues, job state and tiles."""
        return self.data_dir / "ingest"
