"""One buffered NDBlaze write: the header stored beside the body as it arrived, and applying
a decoded body to any region it overlaps.

The header carries everything the merger and the read path need (channel ids, level, box,
time range, dtype, grid, media type), so neither needs the metadata database.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ndstore.core import wire
from ndstore.core.errors import DataCorrupt, InvalidBody
from ndstore.core.geometry import XYZ, Box, Grid, plan_supercuboids
from ndstore.core.keys import SupercuboidKey, VolumeKey
from ndstore.engine.volume import Cutout

Array = npt.NDArray[Any]


@dataclass(frozen=True)
class BlobHeader:
    collection_id: int
    experiment_id: int
    channel_id: int
    resolution: int
    box: Box
    times: range
    dtype: np.dtype
    grid: Grid
    media_type: str
    has_time: bool  # the body is (t, z, y, x); otherwise (z, y, x) of one time sample

    @classmethod
    def for_cutout(cls, cutout: Cutout, media_type: str, has_time: bool) -> BlobHeader:
        ch = cutout.channel
        return cls(ch.collection_id, ch.experiment_id, ch.channel_id, cutout.resolution, cutout.box,
                   cutout.times, ch.dtype, ch.grid(cutout.resolution), media_type, has_time)

    @property
    def body_shape(self) -> tuple[int, ...]:
        zyx = self.box.shape_zyx
        return (len(self.times), *zyx) if self.has_time else zyx

    def volume(self, time: int) -> VolumeKey:
        return VolumeKey(self.collection_id, self.experiment_id, self.channel_id, self.resolution, time)

    def validate(self, body: bytes) -> None:
        """Every check `decode` makes (InvalidBody if one fails): a body that passes decodes."""
        wire.format_for(self.media_type).validate(body, self.body_shape, self.dtype)

    def decode(self, body: bytes) -> Array:
        """The body as a (t, z, y, x) array; raises InvalidBody when it is corrupt."""
        array = wire.format_for(self.media_type).decode(body, self.body_shape, self.dtype)
        return array.reshape((len(self.times), *self.box.shape_zyx))

    def decode_stored(self, seq: int, body: bytes) -> Array:
        """A buffered blob's array. It passed `validate` when it was acknowledged, so a failure
        here means the buffer no longer holds what it stored: DataCorrupt, never a skip (skipping
        would serve, or merge, data without an acknowledged write)."""
        try:
            return self.decode(body)
        except InvalidBody as exc:
            raise DataCorrupt(f"NDBlaze write {seq} was validated when acknowledged but no longer decodes ({exc}); "
                              "it stays pending, and reads and merges of what it touches stop at it") from None

    def to_json(self) -> bytes:
        return json.dumps({
            "ids": [self.collection_id, self.experiment_id, self.channel_id], "res": self.resolution,
            "box": [self.box.lo, self.box.hi], "t": [self.times.start, self.times.stop],
            "dtype": self.dtype.str, "grid": [self.grid.cuboid, self.grid.cuboids_per_super],
            "media": self.media_type, "has_time": self.has_time,
        }).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> BlobHeader:
        h = json.loads(raw)
        lo, hi = (_xyz(v) for v in h["box"])
        cuboid, counts = (_xyz(v) for v in h["grid"])
        collection_id, experiment_id, channel_id = (int(v) for v in h["ids"])
        return cls(collection_id, experiment_id, channel_id, h["res"], Box(lo, hi), range(*h["t"]),
                   np.dtype(h["dtype"]), Grid(cuboid, counts), h["media"], h["has_time"])


def _xyz(v: list[int]) -> XYZ:
    return int(v[0]), int(v[1]), int(v[2])


def apply_to(target: Array, target_box: Box, target_times: range, header: BlobHeader, data: Array,
             clip: Box | None = None, clip_time: int | None = None) -> None:
    """Overwrite the part of ``target`` ((t, z, y, x) over target_box and target_times) that the
    blob covers with the blob's voxels, only inside ``clip`` and time ``clip_time`` when given
    (one supercuboid). Overwriting is idempotent, so applying a blob twice in the same order
    changes nothing."""
    region = header.box.intersect(target_box)
    if region is not None and clip is not None:
        region = region.intersect(clip)
    if region is None:
        return
    into, src = region.slices_zyx(target_box.lo), region.slices_zyx(header.box.lo)
    for ti, t in enumerate(target_times):
        if t in header.times and (clip_time is None or t == clip_time):
            target[ti][into] = data[t - header.times.start][src]


def supercuboid_names(header: BlobHeader) -> list[str]:
    """The names of every supercuboid the blob touches, in every time sample it covers."""
    parts = plan_supercuboids(header.box, header.grid)
    return [SupercuboidKey(header.volume(t), p.morton).name for t in header.times for p in parts]
