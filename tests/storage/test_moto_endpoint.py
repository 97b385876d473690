"""The moto stand-in for AWS must not lose a write that AWS would keep."""

from __future__ import annotations

import sys
import threading
import time
import uuid

import boto3
import pytest
from botocore.exceptions import ClientError

from ndstore.ops.moto_endpoint import SerialMotoServer


def test_a_failed_transaction_does_not_undo_concurrent_writes() -> None:
    # moto's own threaded server loses some of these: a cancelled transaction restores a copy of
    # the whole table taken when it began, over writes that other threads made since. A short switch
    # interval makes the threads interleave as they do on a loaded machine (3 of 3 runs lost writes
    # on moto's ThreadedMotoServer with it).
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    server = SerialMotoServer().start()
    try:
        db = boto3.client("dynamodb", endpoint_url=server.url, region_name="us-east-1")
        table = f"t-{uuid.uuid4().hex}"  # moto's state is per process, and may hold other tests' tables
        db.create_table(TableName=table, KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
                        AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
                        BillingMode="PAY_PER_REQUEST")

        def add(key: str, n: int) -> dict[str, dict[str, object]]:
            return {"Update": {"TableName": table, "Key": {"k": {"S": key}}, "UpdateExpression": "ADD s :n",
                               "ConditionExpression": "attribute_not_exists(s) OR NOT contains(s, :one)",
                               "ExpressionAttributeValues": {":n": {"NS": [str(n)]}, ":one": {"N": str(n)}}}}

        db.transact_write_items(TransactItems=[add("dup", 0)])
        written: dict[str, list[int]] = {}
        failed: list[BaseException] = []

        def writer(name: str) -> None:
            mine = written.setdefault(name, [])
            try:
                for n in range(40):
                    db.transact_write_items(TransactItems=[add(name, n)])
                    mine.append(n)
            except BaseException as exc:  # the assertion below says which write failed, and how
                failed.append(exc)
                raise

        def duplicate() -> None:
            for _ in range(80):
                try:
                    db.transact_write_items(TransactItems=[add("dup", 0)])
                except ClientError as exc:
                    assert exc.response["Error"]["Code"] == "TransactionCanceledException"

        threads = [threading.Thread(target=writer, args=(f"w{i}",)) for i in range(3)]
        threads += [threading.Thread(target=duplicate) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failed, failed
        for name, numbers in written.items():
            item = db.get_item(TableName=table, Key={"k": {"S": name}}, ConsistentRead=True)["Item"]
            assert sorted(int(v) for v in item["s"]["NS"]) == numbers, name
    finally:
        server.stop()
        sys.setswitchinterval(switch_interval)


def test_a_retried_transaction_answers_as_the_first_attempt_did() -> None:
    """botocore retries a TransactWriteItems whose answer it lost with the same ClientRequestToken;
    DynamoDB then answers success and writes nothing twice, so a conditional write does not fail
    on its own first attempt. The same token with other parameters is refused."""
    server = SerialMotoServer().start()
    try:
        db = boto3.client("dynamodb", endpoint_url=server.url, region_name="us-east-1")
        table = f"t-{uuid.uuid4().hex}"
        db.create_table(TableName=table, KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
                        AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
                        BillingMode="PAY_PER_REQUEST")

        def add(n: int) -> list[dict[str, object]]:
            return [{"Update": {"TableName": table, "Key": {"k": {"S": "a"}}, "UpdateExpression": "ADD s :n, c :one",
                                "ConditionExpression": "attribute_not_exists(s) OR NOT contains(s, :m)",
                                "ExpressionAttributeValues": {":n": {"NS": [str(n)]}, ":m": {"N": str(n)},
                                                              ":one": {"N": "1"}}}}]

        token = uuid.uuid4().hex
        for _ in range(3):  # the first attempt and two retries
            db.transact_write_items(TransactItems=add(7), ClientRequestToken=token)
        item = db.get_item(TableName=table, Key={"k": {"S": "a"}}, ConsistentRead=True)["Item"]
        assert item["s"]["NS"] == ["7"] and item["c"]["N"] == "1"
        with pytest.raises(ClientError) as mismatch:
            db.transact_write_items(TransactItems=add(8), ClientRequestToken=token)
        assert mismatch.value.response["Error"]["Code"] == "IdempotentParameterMismatchException"
        with pytest.raises(ClientError) as again:  # a new call (a new token) is a second write
            db.transact_write_items(TransactItems=add(7))
        assert again.value.response["Error"]["Code"] == "TransactionCanceledException"
        item = db.get_item(TableName=table, Key={"k": {"S": "a"}}, ConsistentRead=True)["Item"]
        assert item["s"]["NS"] == ["7"] and item["c"]["N"] == "1"
    finally:
        server.stop()


def test_a_long_poll_lets_other_requests_in_and_gets_what_they_send() -> None:
    server = SerialMotoServer().start()
    try:
        sqs = boto3.client("sqs", endpoint_url=server.url, region_name="us-east-1")
        url = sqs.create_queue(QueueName=f"q-{uuid.uuid4().hex}")["QueueUrl"]
        got: list[dict[str, object]] = []
        poll = threading.Thread(target=lambda: got.extend(
            sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5).get("Messages", [])))
        poll.start()
        time.sleep(0.5)  # the poll is waiting on the empty queue
        sqs.send_message(QueueUrl=url, MessageBody="hello")
        poll.join()
        assert [m["Body"] for m in got] == ["hello"]
    finally:
        server.stop()


def test_queue_attributes_and_the_retention_check_answer_as_moto_does() -> None:
    # the server computes these once per call where moto 5.2 repeats the work (moto_endpoint's
    # docstring); the answers must stay moto's
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.sqs.models import sqs_backends

    server = SerialMotoServer().start()
    try:
        sqs = boto3.client("sqs", endpoint_url=server.url, region_name="us-east-1")
        name = f"q-{uuid.uuid4().hex}"
        url = sqs.create_queue(QueueName=name, Attributes={"MessageRetentionPeriod": "60"})["QueueUrl"]
        for i in range(5):
            sqs.send_message(QueueUrl=url, MessageBody=str(i))
        taken = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=2, VisibilityTimeout=30)["Messages"]
        assert len(taken) == 2
        named = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
            "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible", "MessageRetentionPeriod"])
        assert named["Attributes"] == {"ApproximateNumberOfMessages": "3",
                                       "ApproximateNumberOfMessagesNotVisible": "2", "MessageRetentionPeriod": "60"}
        every = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert {k: every[k] for k in named["Attributes"]} == named["Attributes"] and "QueueArn" in every
        try:
            sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["NoSuchAttribute"])
            raise AssertionError("an unknown attribute name was answered")
        except ClientError as exc:
            assert exc.response["Error"]["Code"] == "InvalidAttributeName"

        for message in sqs_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].queues[name]._messages:
            message.sent_timestamp -= 61_000  # past the queue's 60 s retention
        assert sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=3).get("Messages", []) == []
    finally:
        server.stop()


def test_sends_answer_as_moto_does_without_counting_the_queue() -> None:
    # a send reads its queue's attributes with the message counts left out (moto_endpoint's
    # docstring): FIFO deduplication, which reads one of them, still holds, the counts after it
    # are moto's, and a send to a missing queue is moto's error
    from moto.sqs.models import Queue

    server = SerialMotoServer().start()
    try:
        sqs = boto3.client("sqs", endpoint_url=server.url, region_name="us-east-1")
        fifo = sqs.create_queue(QueueName=f"q-{uuid.uuid4().hex}.fifo", Attributes={
            "FifoQueue": "true", "ContentBasedDeduplication": "true"})["QueueUrl"]
        for _ in range(2):
            sqs.send_message(QueueUrl=fifo, MessageBody="same", MessageGroupId="g")
        sqs.send_message_batch(QueueUrl=fifo, Entries=[
            {"Id": str(i), "MessageBody": body, "MessageGroupId": "g"} for i, body in enumerate(("same", "other"))])
        standard = sqs.create_queue(QueueName=f"q-{uuid.uuid4().hex}")["QueueUrl"]
        sqs.send_message_batch(QueueUrl=standard, Entries=[{"Id": str(i), "MessageBody": "x"} for i in range(7)])
        sqs.send_message(QueueUrl=standard, MessageBody="x", DelaySeconds=60)
        counts = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesDelayed"]
        assert sqs.get_queue_attributes(QueueUrl=fifo, AttributeNames=counts)["Attributes"] == {
            "ApproximateNumberOfMessages": "2", "ApproximateNumberOfMessagesDelayed": "0"}
        assert sqs.get_queue_attributes(QueueUrl=standard, AttributeNames=counts)["Attributes"] == {
            "ApproximateNumberOfMessages": "7", "ApproximateNumberOfMessagesDelayed": "1"}
        assert "ApproximateNumberOfMessages" in Queue.BASE_ATTRIBUTES  # moto's own list is left alone
        try:
            sqs.send_message(QueueUrl=standard.rsplit("/", 1)[0] + "/no-such-queue", MessageBody="x")
            raise AssertionError("a send to a missing queue was answered")
        except ClientError as exc:
            assert "NonExistentQueue" in exc.response["Error"]["Code"]
    finally:
        server.stop()
