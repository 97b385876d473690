"""The ingest tile bucket over S3: presigned PUTs for uploaders (who hold no credentials of
their own), tiles read with their metadata (the upload task's receipt, the content's SHA-256 and
the service's signature of both), and the bucket's event notifications to a queue (how the
tile-uploaded handler hears of a tile where no Lambda trigger exists, e.g. moto's server here)."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from ndstore.core.errors import StorageError
from ndstore.storage.aws import MISSING, Credentials, aws_call, aws_client, new_client
from ndstore.storage.interfaces import UploadTarget


class S3TileBucket:
    def __init__(self, bucket: str, endpoint_url: str | None = None, region: str = "us-east-1", parallelism: int = 16,
                 public_endpoint_url: str | None = None, credentials: Credentials | None = None):
        """`public_endpoint_url`: where uploaders reach the store, when not at `endpoint_url`."""
        self.bucket = bucket
        self._s3 = aws_client("s3", endpoint_url, region, parallelism, credentials=credentials)
        public = public_endpoint_url or endpoint_url
        self._presigner = new_client(  # signs locally: makes no request
            "s3", credentials, endpoint_url=public, region_name=region,
            config=Config(signature_version="s3v4", s3={"addressing_style": "path" if public else "auto"}))
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

    def upload_target(self, key: str, metadata: dict[str, str], expires_s: int) -> UploadTarget:
        """A presigned PUT of `key` whose object metadata must be exactly `metadata`."""
        try:
            url = self._presigner.generate_presigned_url(
                "put_object", Params={"Bucket": self.bucket, "Key": key, "Metadata": metadata}, ExpiresIn=expires_s)
        except (BotoCoreError, ClientError) as exc:
            raise StorageError(f"S3 could not presign the upload of {key}: {exc}") from exc
        return UploadTarget(url, {f"x-amz-meta-{name}": value for name, value in metadata.items()})

    def metadata(self, key: str) -> dict[str, str] | None:
        """The tile's metadata, or None when the tile is not (or no longer) there."""
        try:
            return dict(self._s3.head_object(Bucket=self.bucket, Key=key)["Metadata"])
        except ClientError as exc:
            if exc.response["Error"]["Code"] in MISSING:
                return None
            raise StorageError(f"S3 head_object {key} failed: {exc}") from exc

    def get_many_with_metadata(self, keys: Sequence[str]) -> list[tuple[bytes, dict[str, str]] | None]:
        """Each tile's bytes and metadata (read in one GET), None where it is missing."""
        return list(self._pool.map(self._get, keys))

    def _get(self, key: str) -> tuple[bytes, dict[str, str]] | None:
        try:
            reply = self._s3.get_object(Bucket=self.bucket, Key=key)
            return reply["Body"].read(), dict(reply.get("Metadata", {}))
        except ClientError as exc:
            if exc.response["Error"]["Code"] in MISSING:
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
