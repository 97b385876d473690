"""ObjectStore over any S3-compatible endpoint (AWS, MinIO, moto's server) with boto3."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ndstore.core.errors import StorageError
from ndstore.core.parallel import map_completed, run_all
from ndstore.storage.aws import MISSING, Credentials, aws_call, aws_client

_DELETE_BATCH = 1000


class S3ObjectStore:
    def __init__(self, bucket: str, endpoint_url: str | None = None, region: str = "us-east-1", parallelism: int = 16,
                 timeout_s: float | None = None, credentials: Credentials | None = None):
        self.bucket = bucket
        self._s3 = aws_client("s3", endpoint_url, region, parallelism, timeout_s, credentials)
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

    def get_many(self, keys: Sequence[str], window: int | None = None) -> Iterator[tuple[str, bytes | None]]:
        return map_completed(self._pool, self._get, keys, window)

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
            if exc.response.get("Error", {}).get("Code") in MISSING:
                return None
            raise StorageError(f"S3 GET {key} failed: {exc}") from exc
        except BotoCoreError as exc:
            raise StorageError(f"S3 GET {key} failed: {exc}") from exc

    def _call(self, fn: Any, **kwargs: Any) -> Any:
        return aws_call("S3", fn, **kwargs)
