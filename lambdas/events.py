"""The SQS event shape every queue-triggered handler takes, and its partial-batch answer."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("ndstore.lambdas")
Event = dict[str, Any]


def each_sqs_record(event: Event, work: Callable[[str], object]) -> dict[str, list[dict[str, str]]]:
    """Run `work(body)` per record; the failed ones are reported in `batchItemFailures` (and only
    they are retried by SQS)."""
    failures = []
    for record in event.get("Records", []):
        try:
            work(record["body"])
        except Exception:  # reported back as this record's failure, retried by SQS
            log.exception("record %s failed", record.get("messageId"))
            failures.append({"itemIdentifier": record["messageId"]})
    return {"batchItemFailures": failures}
