"""What the engine needs to know about one channel: ids, dtype, extent and grid per level."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from ndstore.core.errors import InvalidRequest, PayloadTooLarge
from ndstore.core.geometry import Box, Grid, HierarchyMethod, check_inside, grid_for_level, level_extent
from ndstore.core.keys import SEPARATOR, VolumeKey
from ndstore.core.plan import Plan, plan


@dataclass(frozen=True)
class ChannelVolume:
    collection_id: int
    experiment_id: int
    channel_id: int
    dtype: np.dtype
    frame: Box  # the coordinate frame at resolution 0
    num_levels: int
    method: HierarchyMethod
    num_time_samples: int
    write_through: bool = False  # cache-tier writes reach the base tier before they return
    annotation: bool = False  # labels: levels reduce by the mode, not the mean

    def grid(self, resolution: int) -> Grid:
        return grid_for_level(self.method, resolution, self.dtype.itemsize)

    def extent(self, resolution: int) -> Box:
        return level_extent(self.frame, resolution, self.method)

    @property
    def name_prefix(self) -> str:
        """The start of every supercuboid name (lock, cache entry, NDBlaze index) of this channel."""
        return f"{self.collection_id}{SEPARATOR}{self.experiment_id}{SEPARATOR}{self.channel_id}{SEPARATOR}"

    def volume_key(self, resolution: int, time: int) -> VolumeKey:
        return VolumeKey(self.collection_id, self.experiment_id, self.channel_id, resolution, time)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, for job specs that travel through queues and tables."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**out, "dtype": self.dtype.name, "frame": [list(self.frame.lo), list(self.frame.hi)]}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ChannelVolume:
        lo, hi = raw["frame"]
        return cls(**{**raw, "dtype": np.dtype(raw["dtype"]), "frame": Box(tuple(lo), tuple(hi))})


@dataclass(frozen=True)
class Cutout:
    """A validated request region: a channel, a level, a box and a range of time samples."""

    channel: ChannelVolume
    resolution: int
    box: Box
    times: range

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (len(self.times), *self.box.shape_zyx)

    @property
    def nbytes(self) -> int:
        return len(self.times) * self.box.nvoxels * self.channel.dtype.itemsize

    @property
    def supercuboids(self) -> int:
        """How many supercuboids the cutout touches, over all its time samples."""
        return len(self.times) * self.channel.grid(self.resolution).count_touched(self.box)

    def plan(self) -> Plan:
        """The supercuboids the cutout touches, per time sample, with the part of each; made
        once per cutout (a request asks for it in several places)."""
        made: Plan | None = self.__dict__.get("_plan")
        if made is None:
            volumes = [self.channel.volume_key(self.resolution, t) for t in self.times]
            made = plan(volumes, self.box, self.channel.grid(self.resolution))
            object.__setattr__(self, "_plan", made)  # a cache, not a field: equality and hash ignore it
        return made


def check_level(channel: ChannelVolume, resolution: int) -> None:
    if not 0 <= resolution < channel.num_levels:
        raise InvalidRequest(
            f"resolution {resolution} does not exist: this channel has levels 0..{channel.num_levels - 1}"
        )


def make_cutout(channel: ChannelVolume, resolution: int, box: Box, times: range, max_bytes: int) -> Cutout:
    """Validate a request against the channel; every failure names what is wrong."""
    check_level(channel, resolution)
    if len(times) == 0 or times.start < 0 or times.stop > channel.num_time_samples:
        raise InvalidRequest(
            f"time range {times.start}:{times.stop} is empty or outside 0:{channel.num_time_samples}"
        )
    check_inside(box, channel.extent(resolution))
    cutout = Cutout(channel, resolution, box, times)
    if cutout.nbytes > max_bytes:
        raise PayloadTooLarge(f"the box holds {cutout.nbytes} bytes; the limit per request is {max_bytes}")
    return cutout
