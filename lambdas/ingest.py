"""The ingest pipeline's Lambda handlers: AWS event in, one engine call per record, the SQS
partial-batch answer out (`batchItemFailures`: only the failed records are retried).

    tile_uploaded  S3 ObjectCreated events (a direct S3 trigger), or SQS records whose bodies
                   are S3 events (the bucket notifies a queue, as the local runner uses it)
    supercuboid    SQS records of a job's supercuboid queue
    cleanup        SQS records of a job's cleanup queue
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote_plus

from lambdas.events import Event, each_sqs_record
from ndstore.wiring import services


def _s3_keys(s3_event: Event) -> list[str]:
    """Object keys of an S3 notification (keys arrive URL-encoded); a test event has none."""
    return [unquote_plus(r["s3"]["object"]["key"]) for r in s3_event.get("Records", [])
            if r.get("eventSource") == "aws:s3" and r.get("eventName", "").startswith("ObjectCreated")]


def tile_uploaded(event: Event, context: object = None) -> dict[str, Any]:
    ingest = services().ingest
    if any(r.get("eventSource") == "aws:s3" for r in event.get("Records", [])):
        for key in _s3_keys(event):  # a direct trigger: a failure fails the invocation, which Lambda retries
            ingest.tile_uploaded(key)
        return {"batchItemFailures": []}
    return each_sqs_record(event, lambda body: [ingest.tile_uploaded(k) for k in _s3_keys(json.loads(body))])


def supercuboid(event: Event, context: object = None) -> dict[str, Any]:
    return each_sqs_record(event, services().ingest.build_supercuboid)


def cleanup(event: Event, context: object = None) -> dict[str, Any]:
    return each_sqs_record(event, services().ingest.cleanup)
