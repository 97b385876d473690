"""The segmentation products' Lambda handler: one supercuboid's meshes and skeletons rebuilt per
SQS record (ndstore/engine/segments/upkeep.py)."""

from __future__ import annotations

from typing import Any

from lambdas.events import Event, each_sqs_record
from ndstore.wiring import services


def rebuild(event: Event, context: object = None) -> dict[str, Any]:
    products = services().products
    if products is None:
        raise RuntimeError("segmentation products need the label index (NDSTORE_LABEL_BACKEND)")
    try:
        return each_sqs_record(event, products.handle)
    finally:  # Lambda freezes the process between calls: the lag observed here must not wait for a thaw
        services().metrics.flush()
