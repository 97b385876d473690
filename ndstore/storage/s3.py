"""ObjectStore over any S3-compatible endpoint (AWS, MinIO, moto's server) with boto3."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ChecksumError, ClientError
from botocore.retryhandler import CRC32Checker

from ndstore.core.errors import StorageError
from ndstore.storage.parallel import map_completed, run_all

_MISSING = {"NoSuchKey", "404", "NotFound"}
_DELETE_BATCH = 1000
_ATTEMPTS = 5
_DYNAMODB_CRC32 = CRC32Checker(header="x-amz-crc32")  # botocore's own check, left to its legacy retry mode


def _client(service: str, endpoint_url: str | None, region: str, pool: int, timeout_s: float | None = None) -> Any:
    """A boto3 client: 5 attempts with backoff; ``timeout_s`` is the connect and read timeout of
    each attempt (None: botocore's 60 s)."""
    timeouts = {} if timeout_s is None else {"connect_timeout": timeout_s, "read_timeout": timeout_s}
    config = Config(max_pool_connections=pool, retries={"mode": "standard", "max_attempts": _ATTEMPTS}, **timeouts)
    client = boto3.session.Session().client(service, endpoint_url=endpoint_url, region_name=region, config=config)
    if service == "dynamodb":
        client.meta.events.register("needs-retry.dynamodb", _retry_when_the_crc32_does_not_match)
    return client


def _retry_when_the_crc32_does_not_match(response: Any = None, attempts: int = 1, **_: Any) -> float | None:
    """DynamoDB signs each answer's body with `x-amz-crc32`. botocore's standard retry mode does
    not check it, and its JSON parser takes a body cut off half way for an answer with no fields:
    a BatchWriteItem with nothing unprocessed, a GetItem of nothing, an empty Query page. A
    mismatch is retried like a broken connection; after the last attempt it is an error."""
    if response is None or response[0] is None:
        return None
    try:
        _DYNAMODB_CRC32(attempts, response, None)  # raises ChecksumError on a mismatch
    except ChecksumError:
        if attempts >= _ATTEMPTS:
            raise
        return float(min(0.05 * 2**attempts, 2.0))
    return None


def aws_call(service: str, fn: Any, **kwargs: Any) -> Any:
    """Call a boto3 client method; any botocore failure becomes a StorageError naming it."""
    try:
        return fn(**kwargs)
    except (BotoCoreError, ClientError) as exc:
        raise StorageError(f"{service} {fn.__name__} failed: {exc}") from exc


class S3ObjectStore:
    def __init__(self, bucket: str, endpoint_url: str | None = None, region: str = "us-east-1", parallelism: int = 16,
                 timeout_s: float | None = None):
        self.bucket = bucket
        self._s3 = _client("s3", endpoint_url, region, parallelism, timeout_s)
        self._pool = ThreadPoolExecutor(parallelism, thread_name_prefix="s3")

    def ensure_ready(self) -> None:
        try:
            self._s3.head_bucket(Bucket=self.bucket)
        except ClientError:
            try:  # another worker starting at the same moment may create it first
                self._s3.create_bucket(Bucket=self.bucket)
            except ClientError as exc:
                if exc.response["Error"]["Code"] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise StorageError(f"S3 create_bucket {self.bucket} failed: {exc}") from exc
            except BotoCoreError as exc:
                raise StorageError(f"S3 create_bucket {self.bucket} failed: {exc}") from exc

    def get_many(self, keys: Sequence[str]) -> Iterator[tuple[str, bytes | None]]:
        return map_completed(self._pool, self._get, keys)

    def put_many(self, items: Mapping[str, bytes]) -> None:
        run_all(self._pool, lambda k: self._call(self._s3.put_object, Bucket=self.bucket, Key=k, Body=items[k]), items)

    def delete_many(self, keys: Sequence[str]) -> None:
        for i in range(0, len(keys), _DELETE_BATCH):
            batch = [{"Key": k} for k in keys[i : i + _DELETE_BATCH]]
            reply = self._call(self._s3.delete_objects, Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            if reply.get("Errors"):
                raise StorageError(f"S3 refused to delete {len(reply['Errors'])} objects: {reply['Errors'][0]}")

    def list_keys(self, prefix: str = "") -> Iterator[str]:
        """Every key under ``prefix`` (for tests and tools; never on the read path)."""
        for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                yield item["Key"]

    def _get(self, key: str) -> bytes | None:
        try:
            body = self._s3.get_object(Bucket=self.bucket, Key=key)["Body"]
            try:
                return body.read()  # type: ignore[no-any-return]
            finally:
                body.close()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _MISSING:
                return None
            raise StorageError(f"S3 GET {key} failed: {exc}") from exc
        except BotoCoreError as exc:
            raise StorageError(f"S3 GET {key} failed: {exc}") from exc

    def _call(self, fn: Any, **kwargs: Any) -> Any:
        return aws_call("S3", fn, **kwargs)
