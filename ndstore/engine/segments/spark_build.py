"""A whole volume's segmentation products on Spark (`ndstore segmentation --engine spark`), for
sites with a Spark cluster: the driver lists what to build (every stored supercuboid of level 0
and its low-side neighbours), the workers rebuild each (the same `ProductUpkeep.rebuild` the
queue's tasks run, forced: built whether marked stale or not). A supercuboid that fails is
retried in its task, then reported."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from ndstore.core.keys import SupercuboidKey
from ndstore.engine.segments.upkeep import ProductUpkeep

UpkeepFactory = Callable[[], ProductUpkeep]  # picklable: built on a worker from the driver's Config


def build_products(spark: Any, keys: list[SupercuboidKey], factory: UpkeepFactory, tries: int = 3) -> dict[str, Any]:
    """Rebuild the products of ``keys``; returns counts by outcome and the failures (20 at most)."""
    context = spark.sparkContext
    outcomes: list[tuple[str, str]] = []
    if keys:
        slices = max(1, min(len(keys), context.defaultParallelism * 2))
        job = partial(_build_partition, factory, tries)
        outcomes = context.parallelize([k.name for k in keys], slices).mapPartitions(job).collect()
    counts: dict[str, int] = {}
    for _, outcome in outcomes:
        kind = outcome if not outcome.startswith("failed") else "failed"
        counts[kind] = counts.get(kind, 0) + 1
    failures = [{"supercuboid": name, "error": outcome} for name, outcome in outcomes if outcome.startswith("failed")]
    return {"state": "FAILED" if failures else "BUILT", "total": len(keys), "outcomes": counts,
            "failures": failures[:20]}


def _build_partition(factory: UpkeepFactory, tries: int, names: Iterator[str]) -> Iterator[tuple[str, str]]:
    upkeep = factory()
    for name in names:
        outcome = ""
        for _ in range(tries):
            try:
                outcome = upkeep.rebuild(SupercuboidKey.from_name(name), force=True)
                break
            except Exception as exc:  # noqa: BLE001 - retried, then reported to the driver
                outcome = f"failed: {type(exc).__name__}: {exc}"
        yield name, outcome
