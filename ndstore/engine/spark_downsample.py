"""The hierarchy build on Spark (`ndstore downsample --engine spark`), for sites with a Spark
cluster instead of Lambda: the same manifest (from the supercuboid index, on the driver) and the
same per-parent build (on the workers), level by level; a parent that fails is retried in its
task, then reported, and the build stops after that level (a level built on a hole is wrong)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from ndstore.engine.downsample import Downsampler, Parent
from ndstore.engine.volume import ChannelVolume

DownsamplerFactory = Callable[[], Downsampler]  # picklable: built on a worker from the driver's Config


def build_hierarchy(spark: Any, channel: ChannelVolume, driver: Downsampler, factory: DownsamplerFactory,
                    tries: int = 3, on_level: Callable[[int, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Build levels 1.. of `channel`; returns {"state": DOWNSAMPLED | FAILED, "levels": {...}}."""
    context = spark.sparkContext
    levels: dict[str, dict[str, Any]] = {}
    for level in range(1, channel.num_levels):
        parents = driver.manifest(channel, level)
        if parents:
            slices = max(1, min(len(parents), context.defaultParallelism * 2))
            job = partial(_build_partition, factory, channel, tries)
            outcomes = context.parallelize(parents, slices).mapPartitions(job).collect()
        else:
            outcomes = []
        failed = [{"t": p[1], "index": list(p[2]), "error": e} for p, e in outcomes if e]
        levels[str(level)] = {"total": len(parents), "done": len(parents) - len(failed), "failed": len(failed),
                              "failures": failed[:20]}
        if on_level:
            on_level(level, levels[str(level)])
        if failed:
            return {"state": "FAILED", "levels": levels}
    return {"state": "DOWNSAMPLED", "levels": levels}


def _build_partition(factory: DownsamplerFactory, channel: ChannelVolume, tries: int,
                     parents: Iterator[Parent]) -> Iterator[tuple[Parent, str | None]]:
    downsampler = factory()
    for parent in parents:
        error: str | None = None
        for _ in range(tries):
            try:
                downsampler.build_parent(channel, parent)
                error = None
                break
            except Exception as exc:  # noqa: BLE001 - retried, then reported to the driver
                error = f"{type(exc).__name__}: {exc}"
        yield parent, error
