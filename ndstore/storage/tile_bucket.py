"""The ingest tile bucket over S3: tiles with the upload task's receipt as object metadata, and
the bucket's event notifications to a queue (how the tile-uploaded handler hears of a tile where
no Lambda trigger exists, e.g. moto's server here)."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ndstore.core.errors import StorageError
from ndstore.storage.s3 import _MISSING, _client, aws_call

RECEIPT = "upload-receipt"  # x-amz-meta-upload-receipt: the upload task's SQS receipt handle
QUEUE = "upload-queue"  # x-amz-meta-upload-queue: the upload queue's URL


class S3TileBucket:
    def __init__(self, bucket: str, endpoint_url: str | None = None, region: str = "us-east-1", parallelism: int = 16):
        self.bucket = bucket
        self._s3 = _client("s3", endpoint_url, region, parallelism)
        self._pool = ThreadPoolExecutor(parallelism, thread_name_prefix="tiles")

    def _call(self, fn: Any, **kwargs: Any) -> Any:
        return aws_call(f"S3 {self.bucket}", fn, **kwargs)

    def ensure_ready(self, notify_queue_arn: str | None = None) -> None:
        """Create the bucket if missing; with a queue ARN, send ObjectCreated events there."""
        try:
            self._s3.head_bucket(Bucket=self.bucket)
        except ClientError:
            self._call(self._s3.create_bucket, Bucket=self.bucket)
        if notify_queue_arn:
            config = {"QueueConfigurations": [{"QueueArn": notify_queue_arn, "Events": ["s3:ObjectCreated:*"]}]}
            self._call(self._s3.put_bucket_notification_configuration, Bucket=self.bucket,
                       NotificationConfiguration=config)

    def put(self, key: str, body: bytes, metadata: dict[str, str]) -> None:
        self._call(self._s3.put_object, Bucket=self.bucket, Key=key, Body=body, Metadata=metadata)

    def metadata(self, key: str) -> dict[str, str] | None:
        """The tile's metadata, or None when the tile is not (or no longer) there."""
        try:
            return dict(self._s3.head_object(Bucket=self.bucket, Key=key)["Metadata"])
        except ClientError as exc:
            if exc.response["Error"]["Code"] in _MISSING:
                return None
            raise StorageError(f"S3 head_object {key} failed: {exc}") from exc

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return list(self._pool.map(self._get, keys))

    def _get(self, key: str) -> bytes | None:
        try:
            return self._s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()  # type: ignore[no-any-return]
        except ClientError as exc:
            if exc.response["Error"]["Code"] in _MISSING:
                return None
            raise StorageError(f"S3 get_object {key} failed: {exc}") from exc
        except BotoCoreError as exc:
            raise StorageError(f"S3 get_object {key} failed: {exc}") from exc

    def delete_many(self, keys: Sequence[str]) -> None:
        for i in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[i : i + 1000]]
            reply = self._call(self._s3.delete_objects, Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            if reply.get("Errors"):
                raise StorageError(f"S3 refused to delete {len(reply['Errors'])} tiles: {reply['Errors'][0]}")
