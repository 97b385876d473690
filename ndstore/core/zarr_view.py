"""A channel as a Zarr v3 / OME-Zarr 0.5 multiscale group, computed from the volume's geometry:
the group's `zarr.json` (attributes.ome.multiscales), one array per advertised level, and which
box of the level a chunk key names. Nothing is stored in this layout: the API reads each chunk
from the cuboids when it is asked for.

Layout (decisions, docs/design/standard-views.md):
- axes `t, z, y, x` (OME-Zarr's order: time, then space, slowest to fastest), so every time sample
  is readable; unit nanometer (the frame's unit converted, as the precomputed view does);
- array `{level}`: shape (time samples, the level's extent in z, y, x), chunk shape
  (1, cuboid z, y, x) on a grid from the extent's first voxel; a frame that does not start at 0
  is placed by a `translation`, so zarr index 0 is voxel `extent.lo`;
- codecs `bytes` (little endian) then `blosc` (LZ4, level 1, byte shuffle): the frame every
  stored cuboid is (core/chunks.py), so a chunk on the cuboid grid is sent as stored, with no
  decode and no encode; fill_value 0;
- edge chunks are whole chunks (zarr's regular grid), the part past the extent filled with 0.
"""

from __future__ import annotations

from typing import Any

from ndstore.core.chunks import CUBOID_CODEC
from ndstore.core.errors import NotFound
from ndstore.core.geometry import Box, level_extent
from ndstore.core.precomputed import PrecomputedVolume

AXES = ("t", "z", "y", "x")
OME_VERSION = "0.5"


def level_factors(volume: PrecomputedVolume, level: int) -> tuple[int, int, int]:
    """How many base voxels one voxel of `level` spans, (x, y, z)."""
    f = 1 << level
    return (f, f, f if volume.method == "isotropic" else 1)


def labels_group(names: list[str]) -> dict[str, Any]:
    """An image's `labels/` group: the label images (annotation channels) drawn over it."""
    return {"zarr_format": 3, "node_type": "group", "attributes": {"ome": {"version": OME_VERSION, "labels": names}}}


def group(volume: PrecomputedVolume, name: str, voxel_nm: tuple[float, float, float], levels: list[int],
          time_samples: int, image_label: dict[str, Any] | None = None) -> dict[str, Any]:
    """The channel's multiscale group; `image_label` (an annotation channel's): OME-Zarr's
    `image-label` metadata, so readers open it as labels."""
    datasets = []
    for level in levels:
        extent = level_extent(volume.frame, level, volume.method)
        scale_xyz = [v * f for v, f in zip(voxel_nm, level_factors(volume, level))]
        datasets.append({"path": str(level), "coordinateTransformations": [
            {"type": "scale", "scale": [1.0, *scale_xyz[::-1]]},
            {"type": "translation", "translation": [0.0, *(lo * s for lo, s in zip(extent.lo[::-1], scale_xyz[::-1]))]},
        ]})
    axes = [{"name": "t", "type": "time"}] + [{"name": a, "type": "space", "unit": "nanometer"} for a in "zyx"]
    ome: dict[str, Any] = {"version": OME_VERSION, "multiscales": [
        {"name": name, "axes": axes, "datasets": datasets,
         "metadata": {"time_samples": time_samples, "levels_declared": volume.num_levels}}]}
    if image_label is not None:
        ome["image-label"] = {"version": OME_VERSION, **image_label}
    return {"zarr_format": 3, "node_type": "group", "attributes": {"ome": ome}}


def array(volume: PrecomputedVolume, level: int, time_samples: int) -> dict[str, Any]:
    extent = level_extent(volume.frame, level, volume.method)
    cx, cy, cz = volume.grid(level).cuboid
    return {
        "zarr_format": 3, "node_type": "array",
        "shape": [time_samples, *extent.shape_zyx],
        "data_type": volume.dtype.name,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1, cz, cy, cx]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                   {"name": "blosc", "configuration": {**CUBOID_CODEC, "typesize": volume.dtype.itemsize,
                                                        "blocksize": 0}}],
        "dimension_names": list(AXES),
        "attributes": {},
    }


def on_cuboid_grid(volume: PrecomputedVolume, level: int) -> bool:
    """Whether the level's chunks are its cuboids (its extent starts on a cuboid boundary, as
    frames usually do): then a chunk is one stored cuboid, sent as it is stored."""
    extent = level_extent(volume.frame, level, volume.method)
    return all(lo % c == 0 for lo, c in zip(extent.lo, volume.grid(level).cuboid))


def chunk_box(volume: PrecomputedVolume, level: int, time_samples: int, index: tuple[int, int, int, int]
              ) -> tuple[int, Box, tuple[int, int, int]]:
    """(time sample, the part of the level's extent the chunk covers, the chunk's whole shape z, y, x)
    of chunk `c/t/z/y/x`; a key past the grid is a 404 (no such chunk)."""
    t, iz, iy, ix = index
    extent = level_extent(volume.frame, level, volume.method)
    cx, cy, cz = volume.grid(level).cuboid
    lo = (extent.lo[0] + ix * cx, extent.lo[1] + iy * cy, extent.lo[2] + iz * cz)
    if not 0 <= t < time_samples or any(v >= hi for v, hi in zip(lo, extent.hi)):
        grid = [-(-(hi - a) // c) for a, hi, c in zip(extent.lo[::-1], extent.hi[::-1], (cz, cy, cx))]
        raise NotFound(f"no chunk c/{t}/{iz}/{iy}/{ix} in array {level}: its grid is {time_samples} x "
                       f"{' x '.join(map(str, grid))} chunks (t, z, y, x)")
    hi = (min(lo[0] + cx, extent.hi[0]), min(lo[1] + cy, extent.hi[1]), min(lo[2] + cz, extent.hi[2]))
    return t, Box(lo, hi), (cz, cy, cx)
