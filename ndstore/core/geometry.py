"""Boxes, cuboid/supercuboid grids per resolution level, and planning a box into supercuboids.

Coordinates are (x, y, z) tuples, as in URLs; arrays are C-order (z, y, x), as on the wire.
Boxes are half-open. The supercuboid grid is anchored at voxel 0, not at the frame's start,
so a supercuboid's index (and Morton code) never depends on the frame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ndstore.core import morton
from ndstore.core.errors import InvalidRequest, OutOfBounds

XYZ = tuple[int, int, int]
HierarchyMethod = Literal["anisotropic", "isotropic"]

# 256 KiB per cuboid whatever the datatype; 4x4x4 cuboids (16 MiB) per supercuboid.
CUBOID_BYTES = 256 << 10
ANISOTROPIC_CUBOID: XYZ = (128, 128, 16)  # for 1-byte voxels
ISOTROPIC_CUBOID: XYZ = (64, 64, 64)
CUBOIDS_PER_SUPERCUBOID: XYZ = (4, 4, 4)


@dataclass(frozen=True)
class Box:
    """A half-open box [lo, hi) in voxel coordinates, (x, y, z) order."""

    lo: XYZ
    hi: XYZ

    @classmethod
    def from_ranges(cls, x: tuple[int, int], y: tuple[int, int], z: tuple[int, int]) -> Box:
        box = cls((x[0], y[0], z[0]), (x[1], y[1], z[1]))
        for axis, a, b in zip("xyz", box.lo, box.hi):
            if a < 0 or b <= a:
                raise InvalidRequest(f"{axis} range {a}:{b} is empty, inverted or negative")
        return box

    @property
    def shape_zyx(self) -> tuple[int, int, int]:
        return (self.hi[2] - self.lo[2], self.hi[1] - self.lo[1], self.hi[0] - self.lo[0])

    @property
    def nvoxels(self) -> int:
        return math.prod(self.shape_zyx)

    def intersect(self, other: Box) -> Box | None:
        lo = tuple(max(a, b) for a, b in zip(self.lo, other.lo))
        hi = tuple(min(a, b) for a, b in zip(self.hi, other.hi))
        if any(a >= b for a, b in zip(lo, hi)):
            return None
        return Box(lo, hi)  # type: ignore[arg-type]

    def contains(self, other: Box) -> bool:
        return all(a <= b for a, b in zip(self.lo, other.lo)) and all(
            a >= b for a, b in zip(self.hi, other.hi)
        )

    def slices_zyx(self, origin: XYZ = (0, 0, 0)) -> tuple[slice, slice, slice]:
        """Slices of this box in an array (z, y, x) whose voxel [0,0,0] sits at ``origin``."""
        return tuple(  # type: ignore[return-value]
            slice(self.lo[i] - origin[i], self.hi[i] - origin[i]) for i in (2, 1, 0)
        )

    def __str__(self) -> str:
        return "/".join(f"{a}:{b}" for a, b in zip(self.lo, self.hi))


@dataclass(frozen=True)
class Grid:
    """How one resolution level is cut into cuboids and supercuboids."""

    cuboid: XYZ
    cuboids_per_super: XYZ = CUBOIDS_PER_SUPERCUBOID

    @property
    def supercuboid(self) -> XYZ:
        return tuple(c * n for c, n in zip(self.cuboid, self.cuboids_per_super))  # type: ignore[return-value]

    def supercuboid_box(self, index: XYZ) -> Box:
        shape = self.supercuboid
        lo = tuple(i * s for i, s in zip(index, shape))
        return Box(lo, tuple(a + s for a, s in zip(lo, shape)))  # type: ignore[arg-type]

    def index_range(self, box: Box) -> tuple[XYZ, XYZ]:
        """Half-open range of supercuboid indices that ``box`` touches."""
        shape = self.supercuboid
        lo = tuple(a // s for a, s in zip(box.lo, shape))
        hi = tuple(-(-b // s) for b, s in zip(box.hi, shape))
        return lo, hi  # type: ignore[return-value]

    @property
    def cuboid_count(self) -> int:
        """Cuboids in one supercuboid (numbered 0 .. cuboid_count - 1)."""
        return math.prod(self.cuboids_per_super)

    def supercuboid_bytes(self, itemsize: int) -> int:
        """Raw bytes of one supercuboid of ``itemsize``-byte voxels: what its stored object decodes to."""
        return math.prod(self.supercuboid) * itemsize

    def window(self, window_bytes: int, itemsize: int) -> int:
        """How many supercuboids make ``window_bytes`` of raw voxels (at least one): what a large
        read or write holds at once."""
        return max(1, window_bytes // self.supercuboid_bytes(itemsize))

    def count_touched(self, box: Box) -> int:
        """How many supercuboids ``box`` touches (without planning them)."""
        lo, hi = self.index_range(box)
        return (hi[0] - lo[0]) * (hi[1] - lo[1]) * (hi[2] - lo[2])


def cuboid_shape(method: HierarchyMethod, itemsize: int) -> XYZ:
    """A cuboid of CUBOID_BYTES for voxels of 1, 2, 4 or 8 bytes. Anisotropic cuboids give up z
    (16 -> 2) so xy tiles stay wide; isotropic ones halve z, y, x in turn."""
    halvings = (itemsize - 1).bit_length()
    if method == "isotropic":
        shape = list(ISOTROPIC_CUBOID)
        for axis in (2, 1, 0)[:halvings]:
            shape[axis] //= 2
        return (shape[0], shape[1], shape[2])
    x, y, z = ANISOTROPIC_CUBOID
    return (x, y, z >> halvings)


def grid_for_level(method: HierarchyMethod, resolution: int, itemsize: int = 1) -> Grid:
    """The grid of a resolution level. One shape for every level of a channel, so a parent
    supercuboid is always exactly 2x2(x2) children (see docs/design/cuboid-geometry.md)."""
    del resolution  # the shape may come to depend on the level; the signature allows it
    return Grid(cuboid_shape(method, itemsize))


def level_extent(frame: Box, resolution: int, method: HierarchyMethod) -> Box:
    """The frame's extent at a resolution level: x and y (and z if isotropic) scaled by 2^-res,
    rounding outward so the level covers every base voxel."""
    scale = 1 << resolution
    zscale = scale if method == "isotropic" else 1
    scales = (scale, scale, zscale)
    lo = tuple(a // s for a, s in zip(frame.lo, scales))
    hi = tuple(-(-b // s) for b, s in zip(frame.hi, scales))
    return Box(lo, hi)  # type: ignore[arg-type]


def check_inside(box: Box, extent: Box) -> None:
    if not extent.contains(box):
        raise OutOfBounds(f"box {box} lies outside the coordinate frame {extent} at this resolution")


@dataclass(frozen=True)
class SupercuboidPart:
    """The part of a request box that falls in one supercuboid."""

    index: XYZ
    morton: int
    region: Box  # absolute voxel coordinates
    full: bool  # the region covers the whole supercuboid

    def in_supercuboid(self, grid: Grid) -> tuple[slice, slice, slice]:
        return self.region.slices_zyx(grid.supercuboid_box(self.index).lo)

    def local_region(self, grid: Grid) -> Box:
        """The region in coordinates relative to the supercuboid's first voxel."""
        ox, oy, oz = grid.supercuboid_box(self.index).lo
        (lx, ly, lz), (hx, hy, hz) = self.region.lo, self.region.hi
        return Box((lx - ox, ly - oy, lz - oz), (hx - ox, hy - oy, hz - oz))

    def in_box(self, box: Box) -> tuple[slice, slice, slice]:
        return self.region.slices_zyx(box.lo)


# Up to this many supercuboids a plan is made in plain Python (a numpy call costs more than a
# Morton code of a few ints); beyond it, vectorised.
_SCALAR_PLAN = 64


def plan_supercuboids(box: Box, grid: Grid) -> list[SupercuboidPart]:
    """Every supercuboid ``box`` touches, with the part it touches, in Morton order."""
    lo, hi = grid.index_range(box)
    spans = [range(a, b) for a, b in zip(lo, hi)]
    if len(spans[0]) * len(spans[1]) * len(spans[2]) <= _SCALAR_PLAN:
        indexes = [(x, y, z) for x in spans[0] for y in spans[1] for z in spans[2]]
        codes = [morton.encode_one(*index) for index in indexes]
    else:
        ix, iy, iz = np.meshgrid(*(np.arange(r.start, r.stop) for r in spans), indexing="ij")
        indexes = [(int(x), int(y), int(z)) for x, y, z in zip(ix.ravel(), iy.ravel(), iz.ravel())]
        codes = morton.encode(ix.ravel(), iy.ravel(), iz.ravel()).tolist()
    parts = []
    for index, code in zip(indexes, codes):
        sbox = grid.supercuboid_box(index)
        region = box.intersect(sbox)
        assert region is not None
        parts.append(SupercuboidPart(index, code, region, region == sbox))
    parts.sort(key=lambda p: p.morton)
    return parts
