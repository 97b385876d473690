"""Work queues over SQS (AWS, or moto's server locally): each queue has a dead-letter queue that
takes a message after `max_receives` failed tries (SQS's own redrive policy)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from botocore.exceptions import ClientError

from ndstore.core.errors import StorageError
from ndstore.storage.aws import Credentials, aws_call, aws_client
from ndstore.storage.interfaces import Message, QueueCounts

_BATCH = 10  # SQS's limit per send/delete batch


class SqsQueues:
    def __init__(self, endpoint_url: str | None = None, region: str = "us-east-1",
                 credentials: Credentials | None = None):
        self._sqs = aws_client("sqs", endpoint_url, region, 32, credentials=credentials)

    def _call(self, fn: Any, **kwargs: Any) -> Any:
        return aws_call("SQS", fn, **kwargs)

    def create(self, name: str, visibility_s: int, max_receives: int) -> str:
        """Create (or find) queue `name` and its dead-letter queue `name-dlq`; returns its URL."""
        dlq = self._call(self._sqs.create_queue, QueueName=f"{name}-dlq",
                         Attributes={"MessageRetentionPeriod": str(14 * 86400)})["QueueUrl"]
        redrive = json.dumps({"deadLetterTargetArn": self.arn(dlq), "maxReceiveCount": str(max_receives)})
        attributes = {"VisibilityTimeout": str(visibility_s), "RedrivePolicy": redrive,
                      "MessageRetentionPeriod": str(14 * 86400)}
        return str(self._call(self._sqs.create_queue, QueueName=name, Attributes=attributes)["QueueUrl"])

    def url(self, name: str) -> str | None:
        try:
            return str(self._sqs.get_queue_url(QueueName=name)["QueueUrl"])
        except ClientError as exc:
            if "NonExistentQueue" in exc.response["Error"]["Code"] or "QueueDoesNotExist" in str(exc):
                return None
            raise StorageError(f"SQS get_queue_url failed: {exc}") from exc

    def names(self, prefix: str) -> list[str]:
        reply = self._call(self._sqs.list_queues, QueueNamePrefix=prefix)
        return sorted(u.rsplit("/", 1)[1] for u in reply.get("QueueUrls", []))

    def arn(self, url: str) -> str:
        reply = self._call(self._sqs.get_queue_attributes, QueueUrl=url, AttributeNames=["QueueArn"])
        return str(reply["Attributes"]["QueueArn"])

    def delete(self, name: str) -> None:
        for queue in (name, f"{name}-dlq"):
            url = self.url(queue)
            if url:
                self._call(self._sqs.delete_queue, QueueUrl=url)

    def send(self, url: str, bodies: Iterable[str]) -> int:
        """Send in batches of 10; raises if SQS refuses any. Returns the count sent."""
        batch: list[str] = []
        sent = 0
        for body in bodies:
            batch.append(body)
            if len(batch) == _BATCH:
                sent += self._send_batch(url, batch)
                batch = []
        if batch:
            sent += self._send_batch(url, batch)
        return sent

    def _send_batch(self, url: str, bodies: list[str]) -> int:
        entries = [{"Id": str(i), "MessageBody": b} for i, b in enumerate(bodies)]
        reply = self._call(self._sqs.send_message_batch, QueueUrl=url, Entries=entries)
        if reply.get("Failed"):
            raise StorageError(f"SQS refused {len(reply['Failed'])} messages: {reply['Failed'][0]}")
        # An answer cut off half way parses as one with no fields (SQS answers carry no checksum):
        # only an answer that accounts for every message says they were all sent.
        answered = len(reply.get("Successful", []))
        if answered != len(bodies):
            raise StorageError(f"SQS send_message_batch answered for {answered} of {len(bodies)} messages; "
                               "the batch may be sent again")
        return len(bodies)

    def receive(self, url: str, max_messages: int = 10, wait_s: int = 1,
                visibility_s: int | None = None) -> list[Message]:
        kwargs: dict[str, Any] = {"QueueUrl": url, "MaxNumberOfMessages": min(max_messages, _BATCH),
                                  "WaitTimeSeconds": wait_s, "AttributeNames": ["ApproximateReceiveCount"]}
        if visibility_s is not None:
            kwargs["VisibilityTimeout"] = visibility_s
        reply = self._call(self._sqs.receive_message, **kwargs)
        return [Message(m["Body"], m["ReceiptHandle"], int(m["Attributes"].get("ApproximateReceiveCount", 1)), url)
                for m in reply.get("Messages", [])]

    def delete_message(self, url: str, receipt: str) -> None:
        self._call(self._sqs.delete_message, QueueUrl=url, ReceiptHandle=receipt)

    def retry_later(self, message: Message, delay_s: int = 0) -> None:
        """Give a failed message back after `delay_s` instead of its whole visibility timeout."""
        self._call(self._sqs.change_message_visibility, QueueUrl=message.queue_url, ReceiptHandle=message.receipt,
                   VisibilityTimeout=delay_s)

    def counts(self, url: str) -> QueueCounts:
        reply = self._call(self._sqs.get_queue_attributes, QueueUrl=url, AttributeNames=[
            "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
        return QueueCounts(int(reply["ApproximateNumberOfMessages"]),
                           int(reply["ApproximateNumberOfMessagesNotVisible"]))

    def peek(self, url: str, limit: int = 100) -> list[Message]:
        """Up to `limit` messages, looked at without consuming them: they are hidden while read,
        then made visible again together. For dead-letter queues only: a look counts as a receive,
        which a queue with a redrive policy counts towards its dead-letter limit."""
        seen: list[Message] = []
        while len(seen) < limit:
            messages = self.receive(url, min(_BATCH, limit - len(seen)), wait_s=0, visibility_s=30)
            if not messages:
                break
            seen.extend(messages)
        for i in range(0, len(seen), _BATCH):
            self._call(self._sqs.change_message_visibility_batch, QueueUrl=url, Entries=[
                {"Id": str(j), "ReceiptHandle": m.receipt, "VisibilityTimeout": 0}
                for j, m in enumerate(seen[i : i + _BATCH])])
        return seen

    def move_all(self, source_url: str, target_url: str) -> int:
        """Move every message of one queue to another (a dead-letter queue back to its queue):
        send first, then delete, so a crash can only duplicate a message, never lose it."""
        moved = 0
        while messages := self.receive(source_url, _BATCH, wait_s=0, visibility_s=60):
            self._send_batch(target_url, [m.body for m in messages])
            for m in messages:
                self.delete_message(source_url, m.receipt)
            moved += len(messages)
        return moved
