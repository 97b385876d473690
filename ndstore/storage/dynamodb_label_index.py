"""LabelIndex over DynamoDB (any endpoint): one table, partition key `part` (S), sort key `n` (N).

| item | part | n | attribute |
|---|---|---|---|
| a label's entry | `L#<volume>#<label>` | Morton code | `voxels` (N) |
| a supercuboid's entry | `S#<volume>#<morton>` | label | `voxels` (N) |
| an unsettled mark | `U#<volume>` | Morton code | `why` (S) |
| a channel served | `C#<channel prefix>` | 0 | `complete` (BOOL) |

So the supercuboids of a label in a volume are one Query, the labels of a supercuboid another,
and the marks of a volume a third. Labels travel as decimal numbers: N holds 38 digits, so every
uint64 round-trips exactly (the client API sends and returns N as text, never as a float).

Every entry is written twice, which is what makes both lookups one Query; the write order keeps
the by-supercuboid entries a superset of the by-label ones (they are written first and deleted
last), so a rewrite always finds what to drop, even after a crash between the two. Batches of
one phase go out in parallel; a phase ends before the next begins (docs/design/label-index.md).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ndstore.core.errors import StorageError
from ndstore.core.keys import SEPARATOR, SupercuboidKey, VolumeKey
from ndstore.core.parallel import map_ordered, run_all
from ndstore.storage.aws import Credentials, aws_client
from ndstore.storage.dynamodb import batch_write, ensure_table

HASH = "#"
BATCH = 25  # requests per BatchWriteItem
IN_FLIGHT = 8  # BatchWriteItems of one phase at once


def _by_label(partition: str, label: int) -> str:
    return f"L{HASH}{partition}{HASH}{label}"


def _by_supercuboid(key: SupercuboidKey) -> str:
    return f"S{HASH}{key.volume.partition}{HASH}{key.morton}"


def _marks(volume: VolumeKey) -> str:
    return f"U{HASH}{volume.partition}"


def _channel(prefix: str) -> str:
    return f"C{HASH}{prefix}"


def _key(part: str, n: int) -> dict[str, Any]:
    return {"part": {"S": part}, "n": {"N": str(n)}}


class DynamoLabelIndex:
    def __init__(self, table: str, endpoint_url: str | None = None, region: str = "us-east-1",
                 timeout_s: float | None = None, credentials: Credentials | None = None):
        self.table = table
        self._db = aws_client("dynamodb", endpoint_url, region, 16, timeout_s, credentials)
        self._pool = ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="label-index")

    def ensure_ready(self, thorough: bool = False) -> str | None:
        """Create the table if it is missing (DynamoDB keeps it sound: nothing to set aside)."""
        ensure_table(self._db, self.table, [("part", "HASH", "S"), ("n", "RANGE", "N")])
        return None

    # -- the channels served ---------------------------------------------------------------------
    def register(self, prefixes: Sequence[str], complete: bool) -> list[str]:
        new = []
        for prefix in dict.fromkeys(prefixes):
            try:
                self._db.put_item(TableName=self.table, Item={**_key(_channel(prefix), 0),
                                                              "complete": {"BOOL": complete}},
                                  ConditionExpression="attribute_not_exists(part)")
                new.append(prefix)
            except ClientError as exc:
                if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                    raise StorageError(f"DynamoDB put_item failed: {exc}") from exc
            except BotoCoreError as exc:
                raise StorageError(f"DynamoDB put_item failed: {exc}") from exc
        return new

    def set_complete(self, prefixes: Sequence[str]) -> None:
        for prefix in prefixes:
            try:
                self._db.update_item(TableName=self.table, Key=_key(_channel(prefix), 0),
                                     UpdateExpression="SET complete = :t", ExpressionAttributeValues={
                                         ":t": {"BOOL": True}}, ConditionExpression="attribute_exists(part)")
            except ClientError as exc:
                if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                    raise StorageError(f"DynamoDB update_item failed: {exc}") from exc
            except BotoCoreError as exc:
                raise StorageError(f"DynamoDB update_item failed: {exc}") from exc

    def channel(self, prefix: str) -> bool | None:
        try:
            item = self._db.get_item(TableName=self.table, Key=_key(_channel(prefix), 0),
                                     ConsistentRead=True).get("Item")
        except (ClientError, BotoCoreError) as exc:
            raise StorageError(f"DynamoDB get_item failed: {exc}") from exc
        return None if item is None else bool(item["complete"]["BOOL"])

    # -- writes ------------------------------------------------------------------------------------
    def begin(self, counts: Mapping[SupercuboidKey, Mapping[int, int]], why: str) -> None:
        self._phase([{"PutRequest": {"Item": {**_key(_marks(k.volume), k.morton), "why": {"S": why}}}}
                     for k in counts])
        entries = [(k, k.volume.partition, found) for k, found in counts.items()]
        self._phase([{"PutRequest": {"Item": {**_key(_by_supercuboid(k), label), "voxels": {"N": str(voxels)}}}}
                     for k, _, found in entries for label, voxels in found.items()])
        self._phase([{"PutRequest": {"Item": {**_key(_by_label(volume, label), k.morton),
                                              "voxels": {"N": str(voxels)}}}}
                     for k, volume, found in entries for label, voxels in found.items()])

    def settle(self, drops: Mapping[SupercuboidKey, Collection[int]], unmark: bool = True) -> None:
        entries = [(k, k.volume.partition, labels) for k, labels in drops.items()]
        self._phase([{"DeleteRequest": {"Key": _key(_by_label(volume, label), k.morton)}}
                     for k, volume, labels in entries for label in labels])
        self._phase([{"DeleteRequest": {"Key": _key(_by_supercuboid(k), label)}}
                     for k, _, labels in entries for label in labels])
        if unmark:
            self._phase([{"DeleteRequest": {"Key": _key(_marks(k.volume), k.morton)}} for k in drops])

    def _phase(self, requests: list[dict[str, Any]]) -> None:
        """Every request done, in batches at once, before this returns (the next phase's order)."""
        batches = [requests[i : i + BATCH] for i in range(0, len(requests), BATCH)]
        run_all(self._pool, lambda batch: batch_write(self._db, self.table, batch), batches, IN_FLIGHT)

    # -- reads (strongly consistent: a write acknowledged shows in the next read) ------------------
    def labels_of(self, keys: Sequence[SupercuboidKey]) -> dict[SupercuboidKey, dict[int, int]]:
        unique = list(dict.fromkeys(keys))
        found = map_ordered(self._pool, lambda k: self._query(_by_supercuboid(k), "voxels"), unique)
        return {k: {n: int(item["voxels"]["N"]) for n, item in items} for k, items in zip(unique, found)}

    def supercuboids_of(self, volume: VolumeKey, label: int) -> dict[int, int]:
        return {n: int(item["voxels"]["N"]) for n, item in self._query(_by_label(volume.partition, label), "voxels")}

    def unsettled(self, volume: VolumeKey) -> dict[int, str]:
        return {n: item["why"]["S"] for n, item in self._query(_marks(volume), "why")}

    def _query(self, part: str, attribute: str) -> list[tuple[int, dict[str, Any]]]:
        pages = self._db.get_paginator("query").paginate(
            TableName=self.table, KeyConditionExpression="part = :p", ExpressionAttributeValues={":p": {"S": part}},
            ProjectionExpression=f"n, {attribute}", ConsistentRead=True)
        try:
            return [(int(item["n"]["N"]), item) for page in pages for item in page["Items"]]
        except (ClientError, BotoCoreError) as exc:
            raise StorageError(f"DynamoDB query failed: {exc}") from exc

    def indexed(self, prefix: str) -> list[SupercuboidKey]:
        """A scan of the whole table (a rebuild's cost), as SupercuboidIndex.volumes."""
        low = prefix.removesuffix(SEPARATOR)
        scan: dict[str, Any] = {
            "TableName": self.table, "ProjectionExpression": "part, n", "ConsistentRead": True,
            "FilterExpression": "begins_with(part, :s) OR begins_with(part, :u)",
            "ExpressionAttributeValues": {":s": {"S": f"S{HASH}{low}"}, ":u": {"S": f"U{HASH}{low}"}}}
        found: set[SupercuboidKey] = set()
        try:
            for page in self._db.get_paginator("scan").paginate(**scan):
                found.update(_parse(item["part"]["S"], int(item["n"]["N"])) for item in page["Items"])
        except (ClientError, BotoCoreError) as exc:
            raise StorageError(f"DynamoDB scan failed: {exc}") from exc
        return sorted(k for k in found if k.name.startswith(prefix))


def _parse(part: str, n: int) -> SupercuboidKey:
    """The supercuboid of a by-supercuboid entry (`S#<volume>#<morton>`) or of a mark (`U#<volume>`,
    sort key ``n``)."""
    kind, volume, *morton = part.split(HASH)
    return VolumeKey.parse_partition(volume).supercuboid(int(morton[0]) if kind == "S" else n)
