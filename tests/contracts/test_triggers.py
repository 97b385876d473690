"""The Triggers contract on its implementation: LambdaTriggers over moto's Lambda API (real HTTP),
triggers of SQS queues on the same server running functions registered there.

What this cannot run: a trigger's function being invoked by a queue's messages (moto would run
the function in a Docker container of Lambda's runtime, which this machine has not got), so no
message is sent to a queue with a trigger here; the handlers themselves are tested as functions
(tests/ingest/, lambdas/)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from ndstore.storage.interfaces import Triggers
from ndstore.storage.lambda_triggers import LambdaTriggers
from ndstore.storage.sqs import SqsQueues
from ndstore.testing.triggers import TriggersContract
from tests.conftest import moto_lambda_function


class TestLambdaTriggers(TriggersContract):
    @pytest.fixture
    def triggers(self, moto_endpoint: str) -> Triggers:
        return LambdaTriggers(moto_endpoint)

    @pytest.fixture
    def queue_arn(self, moto_endpoint: str) -> Callable[[], str]:
        queues = SqsQueues(moto_endpoint)
        return lambda: queues.arn(queues.create(f"trig-{uuid.uuid4().hex[:12]}", 60, 3))

    @pytest.fixture(scope="class")
    @classmethod
    def functions(cls, moto_endpoint: str) -> tuple[str, str]:
        return (moto_lambda_function(moto_endpoint, "lambdas.ingest.supercuboid"),
                moto_lambda_function(moto_endpoint, "lambdas.ingest.cleanup"))

    def attached(self, triggers: Triggers, queue_arn: str) -> list[tuple[str, int]]:
        assert isinstance(triggers, LambdaTriggers)
        return [(m["FunctionArn"], m["BatchSize"]) for m in triggers.mappings(queue_arn)]

    def test_a_lambda_trigger_reports_partial_batch_failures(self, triggers: Triggers, queue_arn: Callable[[], str],
                                                             functions: tuple[str, str]) -> None:
        """The handlers answer with the messages that failed (lambdas/): only those come back."""
        arn = queue_arn()
        triggers.attach(arn, functions[0])
        assert isinstance(triggers, LambdaTriggers)
        [mapping] = triggers.mappings(arn)
        assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
        assert mapping["EventSourceArn"] == arn
