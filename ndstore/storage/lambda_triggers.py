"""SQS -> Lambda triggers (event source mappings) over the Lambda API: on AWS, a job's
supercuboid and cleanup queues are created with the job, so their triggers are too."""

from __future__ import annotations

from typing import Any

from ndstore.storage.aws import Credentials, aws_call, aws_client


class LambdaTriggers:
    def __init__(self, endpoint_url: str | None = None, region: str = "us-east-1",
                 credentials: Credentials | None = None):
        self._lambda = aws_client("lambda", endpoint_url, region, 4, credentials=credentials)

    def _call(self, fn: Any, **kwargs: Any) -> Any:
        return aws_call("Lambda", fn, **kwargs)

    def mappings(self, queue_arn: str) -> list[dict[str, Any]]:
        reply = self._call(self._lambda.list_event_source_mappings, EventSourceArn=queue_arn)
        return list(reply.get("EventSourceMappings", []))

    def attach(self, queue_arn: str, function: str, batch_size: int = 10) -> None:
        """Trigger `function` with the queue's messages, reporting partial batch failures;
        idempotent (a queue that has a trigger keeps it)."""
        if self.mappings(queue_arn):
            return
        self._call(self._lambda.create_event_source_mapping, EventSourceArn=queue_arn, FunctionName=function,
                   BatchSize=batch_size, FunctionResponseTypes=["ReportBatchItemFailures"])

    def detach(self, queue_arn: str) -> None:
        for mapping in self.mappings(queue_arn):
            self._call(self._lambda.delete_event_source_mapping, UUID=mapping["UUID"])
