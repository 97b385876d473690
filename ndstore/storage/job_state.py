"""JobState over DynamoDB (the table NDSTORE_TILE_INDEX_TABLE names): ingest jobs (one row per
job: its sealed spec and progress counters; one per supercuboid of a job: which of its tiles
have arrived and how far the pipeline took it) and downsample runs (keys `ds&<job>...`: per
level total/done, per task done).

Every state change that a counter follows is a transaction with a condition, so a duplicate
event, or a retried handler, never counts twice (see docs/design/ingest.md).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ndstore.core.errors import StorageError
from ndstore.storage.aws import Credentials, aws_call, aws_client
from ndstore.storage.dynamodb import ensure_table

COUNTERS = ("tiles_uploaded", "supercuboids_built", "supercuboids_cleaned")
UPLOADER = re.compile(r"[A-Za-z0-9_-]{1,64}")


class DynamoJobState:
    def __init__(self, table: str, endpoint_url: str | None = None, region: str = "us-east-1",
                 credentials: Credentials | None = None):
        self.table = table
        self._db = aws_client("dynamodb", endpoint_url, region, 32, credentials=credentials)

    def _call(self, fn: Any, **kwargs: Any) -> Any:
        return aws_call(f"DynamoDB {self.table}", fn, **kwargs)

    def _conditional_update(self, what: str, **update: Any) -> Any | None:
        """An UpdateItem whose ConditionExpression may not hold: its reply, or None when it did not."""
        try:
            return self._db.update_item(TableName=self.table, **update)
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return None
            raise StorageError(f"DynamoDB {what} on {self.table} failed: {exc}") from exc
        except BotoCoreError as exc:
            raise StorageError(f"DynamoDB {what} on {self.table} failed: {exc}") from exc

    def ensure_ready(self) -> None:
        try:
            ensure_table(self._db, self.table, [("key", "HASH", "S")])
        except BotoCoreError as exc:  # unreachable: as every other call here, a StorageError (503)
            raise StorageError(f"DynamoDB {self.table}: ensure_ready failed: {exc}") from exc

    @staticmethod
    def _key(key: str) -> dict[str, Any]:
        return {"key": {"S": key}}

    def _transact(self, items: list[dict[str, Any]]) -> bool:
        """True when applied; False when a condition failed (the change was made before)."""
        try:
            self._db.transact_write_items(TransactItems=items)
            return True
        except ClientError as exc:
            reasons = exc.response.get("CancellationReasons") or []
            if exc.response["Error"]["Code"] == "TransactionCanceledException" and any(
                    r.get("Code") == "ConditionalCheckFailed" for r in reasons):
                return False
            raise StorageError(f"DynamoDB transaction on {self.table} failed: {exc}") from exc
        except BotoCoreError as exc:
            raise StorageError(f"DynamoDB transaction on {self.table} failed: {exc}") from exc

    def _count(self, job: str, counter: str) -> dict[str, Any]:
        return {"Update": {"TableName": self.table, "Key": self._key(job), "UpdateExpression": "ADD #c :one",
                           "ExpressionAttributeNames": {"#c": counter},
                           "ExpressionAttributeValues": {":one": {"N": "1"}}}}

    # -- tiles -----------------------------------------------------------------------------------
    def record_tile(self, job: str, supercuboid: str, ordinal: int, expected: int) -> bool:
        """Add a tile to its supercuboid's row; False when it was there already (or the
        supercuboid was cleaned up: a late duplicate event)."""
        update = {"Update": {
            "TableName": self.table, "Key": self._key(supercuboid),
            "UpdateExpression": "ADD tiles :ords SET expected = :expected",
            "ConditionExpression": "(attribute_not_exists(tiles) OR NOT contains(tiles, :ord)) "
                                   "AND attribute_not_exists(cleaned)",
            "ExpressionAttributeValues": {":ords": {"NS": [str(ordinal)]}, ":ord": {"N": str(ordinal)},
                                          ":expected": {"N": str(expected)}}}}
        return self._transact([update, self._count(job, "tiles_uploaded")])

    def supercuboid(self, supercuboid: str) -> dict[str, Any]:
        """The row as plain values: tiles (set of ordinals), expected, claim, queued, built, cleaned."""
        item = self._call(self._db.get_item, TableName=self.table, Key=self._key(supercuboid),
                          ConsistentRead=True).get("Item", {})
        return {
            "tiles": {int(v) for v in item.get("tiles", {}).get("NS", [])},
            "expected": int(item.get("expected", {}).get("N", "0")),
            "claim": item.get("claim", {}).get("S"),
            **{flag: item.get(flag, {}).get("BOOL", False) for flag in ("queued", "built", "cleaned")},
        }

    def has_tile(self, supercuboid: str, ordinal: int) -> bool:
        row = self.supercuboid(supercuboid)
        return ordinal in row["tiles"] or bool(row["cleaned"])

    # -- the supercuboid's way through the pipeline --------------------------------------------
    def claim(self, supercuboid: str, claimant: str) -> bool:
        """Take the right to queue the supercuboid's task; the same claimant may take it again
        (its retry), another may not."""
        return self._conditional_update(
            "claim", Key=self._key(supercuboid), UpdateExpression="SET claim = :c",
            ConditionExpression="attribute_not_exists(claim) OR claim = :c",
            ExpressionAttributeValues={":c": {"S": claimant}}) is not None

    def mark(self, supercuboid: str, flag: str) -> None:
        self._call(self._db.update_item, TableName=self.table, Key=self._key(supercuboid),
                   UpdateExpression="SET #f = :t", ExpressionAttributeNames={"#f": flag},
                   ExpressionAttributeValues={":t": {"BOOL": True}})

    def mark_counted(self, job: str, supercuboid: str, flag: str, counter: str, drop_tiles: bool = False) -> bool:
        """Set a flag once and count it on the job; False when it was set before."""
        expression = "SET #f = :t" + (" REMOVE tiles" if drop_tiles else "")
        update = {"Update": {"TableName": self.table, "Key": self._key(supercuboid), "UpdateExpression": expression,
                             "ConditionExpression": "attribute_not_exists(#f)",
                             "ExpressionAttributeNames": {"#f": flag},
                             "ExpressionAttributeValues": {":t": {"BOOL": True}}}}
        return self._transact([update, self._count(job, counter)])

    def set_count(self, key: str, name: str, value: int) -> None:
        self._call(self._db.update_item, TableName=self.table, Key=self._key(key), UpdateExpression="SET #n = :v",
                   ExpressionAttributeNames={"#n": name}, ExpressionAttributeValues={":v": {"N": str(value)}})

    def counters(self, key: str) -> dict[str, int]:
        """Every number attribute of a row."""
        item = self._call(self._db.get_item, TableName=self.table, Key=self._key(key),
                          ConsistentRead=True).get("Item", {})
        return {name: int(value["N"]) for name, value in item.items() if "N" in value}

    # -- jobs ------------------------------------------------------------------------------------
    def job(self, job: str) -> dict[str, int]:
        item = self._call(self._db.get_item, TableName=self.table, Key=self._key(job),
                          ConsistentRead=True).get("Item", {})
        return {name: int(item.get(name, {}).get("N", "0")) for name in (*COUNTERS, "manifest_sent")}

    def put_job(self, job: str, spec: str) -> None:
        self._call(self._db.update_item, TableName=self.table, Key=self._key(job),
                   UpdateExpression="SET spec = :s", ExpressionAttributeValues={":s": {"S": spec}})

    def job_spec(self, job: str) -> str | None:
        item = self._call(self._db.get_item, TableName=self.table, Key=self._key(job),
                          ConsistentRead=True).get("Item", {})
        return item["spec"]["S"] if "spec" in item else None

    def advance_manifest(self, job: str, sent: int, to: int) -> bool:
        """Record that the manifest's upload tasks up to `to` are queued, if `sent` were before
        (False: another caller recorded that chunk first)."""
        condition = "manifest_sent = :sent" + (" OR attribute_not_exists(manifest_sent)" if sent == 0 else "")
        return self._conditional_update(
            f"update of {job}'s manifest", Key=self._key(job), UpdateExpression="SET manifest_sent = :to",
            ConditionExpression=condition,
            ExpressionAttributeValues={":to": {"N": str(to)}, ":sent": {"N": str(sent)}}) is not None

    # -- leaves to upload ---------------------------------------------------------------------
    @staticmethod
    def _leave(uploader: str) -> dict[str, str]:
        if not UPLOADER.fullmatch(uploader):
            raise StorageError(f"DynamoDB job state: {uploader!r:.80} is not an uploader's name")
        return {"#l": f"leave_{uploader}"}

    def open_leave(self, job: str, uploader: str) -> str | None:
        """The uploader's leave (made on the first call); None once the job is stopped."""
        reply = self._conditional_update(
            "open_leave", Key=self._key(job), UpdateExpression="SET #l = if_not_exists(#l, :new)",
            ConditionExpression="attribute_not_exists(stopped)", ExpressionAttributeNames=self._leave(uploader),
            ExpressionAttributeValues={":new": {"S": secrets.token_hex(12)}}, ReturnValues="ALL_NEW")
        if reply is None:
            return None
        return str(reply["Attributes"][f"leave_{uploader}"]["S"])

    def leaves(self, job: str) -> dict[str, str] | None:
        item = self._call(self._db.get_item, TableName=self.table, Key=self._key(job),
                          ConsistentRead=True).get("Item", {})
        if "stopped" in item or "spec" not in item:
            return None
        return {name[6:]: value["S"] for name, value in item.items() if name.startswith("leave_") and "S" in value}

    def revoke_leave(self, job: str, uploader: str) -> None:
        self._call(self._db.update_item, TableName=self.table, Key=self._key(job), UpdateExpression="REMOVE #l",
                   ExpressionAttributeNames=self._leave(uploader))

    def stop(self, job: str) -> None:
        self._call(self._db.update_item, TableName=self.table, Key=self._key(job),
                   UpdateExpression="SET stopped = :t", ExpressionAttributeValues={":t": {"BOOL": True}})

    def delete(self, keys: Sequence[str]) -> None:
        for i in range(0, len(keys), 25):
            requests = [{"DeleteRequest": {"Key": self._key(k)}} for k in keys[i : i + 25]]
            pending: dict[str, Any] = {self.table: requests}
            while pending:
                pending = self._call(self._db.batch_write_item, RequestItems=pending).get("UnprocessedItems") or {}
