"""SupercuboidIndex over DynamoDB (any endpoint): partition key = volume, sort key = Morton."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ndstore.core.errors import StorageError
from ndstore.core.keys import SupercuboidKey, VolumeKey
from ndstore.storage.aws import Credentials, aws_client


def ensure_table(db: Any, table: str, keys: list[tuple[str, str, str]]) -> None:
    """Create the table (on-demand billing) with `keys` as (attribute, HASH|RANGE, S|N) if it
    does not exist, and wait until it does."""
    try:
        db.describe_table(TableName=table)
        return
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "ResourceNotFoundException":
            raise StorageError(f"DynamoDB describe_table failed: {exc}") from exc
    try:
        db.create_table(TableName=table,
                        KeySchema=[{"AttributeName": name, "KeyType": kind} for name, kind, _ in keys],
                        AttributeDefinitions=[{"AttributeName": name, "AttributeType": t} for name, _, t in keys],
                        BillingMode="PAY_PER_REQUEST")
    except ClientError as exc:  # another worker starting at the same moment created it first
        if exc.response["Error"]["Code"] != "ResourceInUseException":
            raise StorageError(f"DynamoDB create_table {table} failed: {exc}") from exc
    except BotoCoreError as exc:
        raise StorageError(f"DynamoDB create_table {table} failed: {exc}") from exc
    db.get_waiter("table_exists").wait(TableName=table)


def batch_write(db: Any, table: str, requests: list[dict[str, Any]]) -> None:
    """Put and delete requests, 25 to a BatchWriteItem, each batch retried until all is done."""
    try:
        for i in range(0, len(requests), 25):
            pending = {table: requests[i : i + 25]}
            for _ in range(8):
                reply = db.batch_write_item(RequestItems=pending)
                pending = reply.get("UnprocessedItems") or {}
                if not pending:
                    break
            else:
                raise StorageError("DynamoDB left items unprocessed after 8 tries")
    except (ClientError, BotoCoreError) as exc:
        raise StorageError(f"DynamoDB batch write failed: {exc}") from exc


class DynamoSupercuboidIndex:
    def __init__(self, table: str, endpoint_url: str | None = None, region: str = "us-east-1",
                 timeout_s: float | None = None, credentials: Credentials | None = None):
        self.table = table
        self._db = aws_client("dynamodb", endpoint_url, region, 16, timeout_s, credentials)

    def ensure_ready(self, thorough: bool = False) -> str | None:
        """Create the table if it is missing (DynamoDB keeps it sound: nothing to set aside)."""
        ensure_table(self._db, self.table, [("volume", "HASH", "S"), ("morton", "RANGE", "N")])
        return None

    @staticmethod
    def _item(key: SupercuboidKey) -> dict[str, Any]:
        return {"volume": {"S": key.volume.partition}, "morton": {"N": str(key.morton)}}

    def put_many(self, keys: Sequence[SupercuboidKey]) -> None:
        item = self._item
        self._batch([{"PutRequest": {"Item": {**item(k), "object_key": {"S": k.object_key}}}} for k in keys])

    def delete_many(self, keys: Sequence[SupercuboidKey]) -> None:
        self._batch([{"DeleteRequest": {"Key": self._item(k)}} for k in keys])

    def _batch(self, requests: list[dict[str, Any]]) -> None:
        batch_write(self._db, self.table, requests)

    def mortons(self, volume: VolumeKey) -> list[int]:
        out: list[int] = []
        pages = self._db.get_paginator("query").paginate(
            TableName=self.table,
            KeyConditionExpression="volume = :v",
            ExpressionAttributeValues={":v": {"S": volume.partition}},
            ProjectionExpression="morton",
        )
        try:
            for page in pages:
                out.extend(int(item["morton"]["N"]) for item in page["Items"])
        except (ClientError, BotoCoreError) as exc:
            raise StorageError(f"DynamoDB query failed: {exc}") from exc
        return out

    def volumes(self, prefix: str) -> list[VolumeKey]:
        """A scan of the whole table (DynamoDB queries one partition at a time, and a channel's
        levels and time samples are partitions of their own): a bulk operation's cost."""
        scan: dict[str, Any] = {"TableName": self.table, "ProjectionExpression": "volume"}
        if prefix:
            scan.update(FilterExpression="begins_with(volume, :p)", ExpressionAttributeValues={":p": {"S": prefix}})
        found: set[str] = set()
        try:
            for page in self._db.get_paginator("scan").paginate(**scan):
                found.update(item["volume"]["S"] for item in page["Items"])
        except (ClientError, BotoCoreError) as exc:
            raise StorageError(f"DynamoDB scan failed: {exc}") from exc
        return sorted(VolumeKey.parse_partition(v) for v in found)
