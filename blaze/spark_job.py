"""The merge job on Spark: pending supercuboids spread over tasks, each merged by a worker.

The grouping of blobs per supercuboid is the buffer's secondary index, so no blob bytes go
through Spark's shuffle: the driver lists the pending supercuboids, sorts them by volume and
Morton code (neighbours share blobs, and a partition decodes a shared blob once), and each task
merges its slice, reading blobs from the buffer and writing the base tier itself. Workers build
their services from the driver's Config, passed with the task (`make_merger`, a picklable
callable such as `partial(wiring.merger_for, config)`), so the same job runs in local mode
(`local[*]`, the default) and on any cluster reached by a master URL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from blaze.merge import Merger, MergeResult
from ndstore.core.keys import SupercuboidKey
from ndstore.engine.spark import spark_session
from ndstore.storage.interfaces import BlazeBuffer

__all__ = ["merge_round", "spark_session"]


def merge_round(spark: Any, buffer: BlazeBuffer, make_merger: Callable[[], Merger], prefix: str = "",
                partitions: int | None = None) -> MergeResult:
    """Merge every supercuboid pending now (of names starting with ``prefix``)."""
    names = sorted(buffer.pending_names(prefix), key=SupercuboidKey.from_name)
    if not names:
        return MergeResult()
    context = spark.sparkContext
    slices = max(1, min(len(names), partitions or context.defaultParallelism))
    job = partial(_merge_partition, make_merger)
    results = context.parallelize(names, slices).mapPartitions(job).collect()
    return sum((MergeResult(**r) for r in results), MergeResult())


def _merge_partition(make_merger: Callable[[], Merger], names: Iterator[str]) -> Iterator[dict[str, Any]]:
    yield make_merger().merge(names).as_dict()
