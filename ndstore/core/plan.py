"""The plan of a request: which supercuboids of which time samples a box touches, and which part
of each. A pure function of the box, the level's grid and the volumes (one per time sample);
every tier executes the same plan."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ndstore.core.geometry import Box, Grid, SupercuboidPart, plan_supercuboids
from ndstore.core.keys import SupercuboidKey, VolumeKey


@dataclass(frozen=True)
class PlannedPart:
    """One supercuboid of one time sample, and the part of the box inside it."""

    key: SupercuboidKey
    time_index: int  # position of the time sample in the request's time range
    part: SupercuboidPart


@dataclass(frozen=True)
class Plan:
    grid: Grid
    parts: tuple[PlannedPart, ...]  # by time sample, then Morton order

    @property
    def keys(self) -> list[SupercuboidKey]:
        """Each touched supercuboid once, in plan order."""
        return list({p.key.name: p.key for p in self.parts}.values())

    @property
    def names(self) -> list[str]:
        """The touched supercuboids' names (their lock and cache names), sorted."""
        return sorted({p.key.name for p in self.parts})


def plan(volumes: Sequence[VolumeKey], box: Box, grid: Grid) -> Plan:
    """The plan of `box` over one volume per time sample (in the request's order)."""
    parts = plan_supercuboids(box, grid)
    return Plan(grid, tuple(PlannedPart(volume.supercuboid(p.morton), ti, p)
                            for ti, volume in enumerate(volumes) for p in parts))
