"""The hierarchy build's Lambda handler: one parent supercuboid per SQS record; the record that
completes a level queues the next level."""

from __future__ import annotations

from typing import Any

from lambdas.events import Event, each_sqs_record
from ndstore.wiring import services


def parent(event: Event, context: object = None) -> dict[str, Any]:
    return each_sqs_record(event, services().downsample_runs.handle)
