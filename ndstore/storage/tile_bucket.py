"""The ingest tile bucket over S3: presigned PUTs for uploaders (who hold no credentials of
their own), tiles read with their metadata (the upload task's receipt, the content's SHA-256 and
the service's signature of both; a tile is read only after its size is known not to pass its
job's bound, and only a few at a time), and the bucket's event notifications to a queue (how the
tile-uploaded handler hears of a tile where no Lambda trigger exists, e.g. moto's server here)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from ndstore.core.errors import PayloadTooLarge, StorageError
from ndstore.core.parallel import map_completed
from ndstore.storage.aws import MISSING, Credentials, aws_call, aws_client, new_client
from ndstore.storage.interfaces import TileHead, UploadTarget

READ_AHEAD_BYTES = 32 << 20  # of tiles fetched ahead of the supercuboid handler's decoding


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
        self.parallelism = parallelism
        self._pool = ThreadPoolExecutor(parallelism, thread_name_prefix="tiles")

    def _call(self, fn: Any, **kwargs: Any) -> Any:
        return aws_call(f"S3 {self.bucket}", fn, **kwargs)

    def ensure_ready(self, notify_queue_arn: str | None = None) -> None:
        """Create the bucket if missing; with a queue ARN, send ObjectCreated events there."""
        try:
            self._s3.head_bucket(Bucket=self.bucket)
        except ClientError:
            self._call(self._s3.create_bucket, Bucket=self.bucket)
        except BotoCoreError as exc:
            raise StorageError(f"S3 {self.bucket}: head_bucket failed: {exc}") from exc
        if notify_queue_arn:
            config = {"QueueConfigurations": [{"QueueArn": notify_queue_arn, "Events": ["s3:ObjectCreated:*"]}]}
            self._call(self._s3.put_bucket_notification_configuration, Bucket=self.bucket,
                       NotificationConfiguration=config)

    def put(self, key: str, body: bytes, metadata: dict[str, str]) -> None:
        self._call(self._s3.put_object, Bucket=self.bucket, Key=key, Body=body, Metadata=metadata)

    def upload_target(self, key: str, metadata: dict[str, str], expires_s: int, size: int) -> UploadTarget:
        """A presigned PUT of `key` whose object metadata must be exactly `metadata` and whose
        Content-Length must be `size` (both are signed headers of the URL)."""
        try:
            url = self._presigner.generate_presigned_url(
                "put_object", Params={"Bucket": self.bucket, "Key": key, "Metadata": metadata, "ContentLength": size},
                ExpiresIn=expires_s)
        except (BotoCoreError, ClientError) as exc:
            raise StorageError(f"S3 could not presign the upload of {key}: {exc}") from exc
        return UploadTarget(url, {f"x-amz-meta-{name}": value for name, value in metadata.items()})

    def head(self, key: str) -> TileHead | None:
        """The tile's metadata, size and Last-Modified, or None when it is not (or no longer) there."""
        try:
            reply = self._s3.head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if exc.response["Error"]["Code"] in MISSING:
                return None
            raise StorageError(f"S3 head_object {key} failed: {exc}") from exc
        except BotoCoreError as exc:
            raise StorageError(f"S3 head_object {key} failed: {exc}") from exc
        return TileHead(dict(reply["Metadata"]), int(reply["ContentLength"]), reply["LastModified"].timestamp())

    def metadata(self, key: str) -> dict[str, str] | None:
        """The tile's metadata, or None when the tile is not (or no longer) there."""
        head = self.head(key)
        return None if head is None else head.metadata

    def get_many_with_metadata(self, keys: Sequence[str], max_bytes: int
                               ) -> Iterator[tuple[str, tuple[bytes, dict[str, str]] | None]]:
        """(key, (bytes, metadata)) per tile in the order they arrive (one GET each), None where
        it is missing; at most READ_AHEAD_BYTES of tiles (one at least) read ahead of the caller."""
        window = max(1, min(self.parallelism, READ_AHEAD_BYTES // max(1, max_bytes)))
        return map_completed(self._pool, partial(self._get, max_bytes=max_bytes), keys, window)

    def _get(self, key: str, max_bytes: int) -> tuple[bytes, dict[str, str]] | None:
        try:
            reply = self._s3.get_object(Bucket=self.bucket, Key=key)
            body = reply["Body"]
            if int(reply["ContentLength"]) > max_bytes:  # known from the headers: the body is never read
                body.close()
                raise PayloadTooLarge(f"tile {key} holds {reply['ContentLength']} bytes; its job's tiles hold at "
                                      f"most {max_bytes}")
            return body.read(max_bytes + 1), dict(reply.get("Metadata", {}))
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
