"""The geometry of a tile ingest: which 2-D tiles make up a box, which supercuboid each tile
belongs to, and the names tiles take in the tile bucket. Pure arithmetic; no I/O.

Tiles lie on the frame's tile grid: tile (x_index, y_index) at slice z covers x in
[x_index * tile_x, (x_index + 1) * tile_x) (and the same in y), clipped to the ingest box. The
tile size divides the supercuboid's x and y extent, so every tile belongs to exactly one
supercuboid; a supercuboid's tiles are numbered by their ordinal inside it.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image

from ndstore.core import morton
from ndstore.core.errors import InvalidBody, InvalidRequest
from ndstore.core.geometry import Box, Grid

TILE_FORMATS = {"png": "png", "tif": "tif", "tiff": "tif"}
# Tiles one supercuboid may take: what one build reads and one row of the tile index holds (its
# set of arrived tiles; a DynamoDB item holds at most 400 KB). 64 x 64 tiles in the 512 x 512 x 64
# supercuboid of an 8-bit anisotropic channel.
MAX_TILES_PER_SUPERCUBOID = 4096
# What a tile file may hold beyond its pixels: twice the raw voxels (LZW's worst expansion of
# incompressible data is 12 bits per byte; PNG's stored blocks and row filters add under 1 %; a
# 16-bit file of 8-bit values doubles them) plus 64 KiB of headers, chunks and tags.
TILE_FRAMING_BYTES = 64 << 10


@dataclass(frozen=True, order=True)
class TileRef:
    t: int
    z: int
    y_index: int
    x_index: int

    def __str__(self) -> str:
        return f"t={self.t} z={self.z} y={self.y_index} x={self.x_index}"


@dataclass(frozen=True, order=True)
class SupercuboidRef:
    t: int
    index: tuple[int, int, int]  # supercuboid grid index (x, y, z)

    @property
    def morton(self) -> int:
        return morton.encode_one(*self.index)


@dataclass(frozen=True)
class TileLayout:
    box: Box  # the ingest region at resolution 0 (x, y, z)
    tile_x: int
    tile_y: int
    times: range
    grid: Grid  # the channel's grid at resolution 0

    def validate(self) -> None:
        """Every rule a job must meet, each failure named."""
        sx, sy, _ = self.grid.supercuboid
        for name, size, extent in (("tile_x", self.tile_x, sx), ("tile_y", self.tile_y, sy)):
            if size <= 0 or extent % size:
                raise InvalidRequest(f"{name} {size} must divide the supercuboid extent {extent} "
                                     f"(a power of two up to {extent} for this channel)")
        if self.box.lo[0] % self.tile_x or self.box.lo[1] % self.tile_y:
            raise InvalidRequest(f"the box must start on the tile grid: x {self.box.lo[0]} is not a multiple of "
                                 f"{self.tile_x} or y {self.box.lo[1]} of {self.tile_y}")
        if any(h <= lo for lo, h in zip(self.box.lo, self.box.hi)):
            raise InvalidRequest(f"the box {self.box} is empty")
        if len(self.times) == 0:
            raise InvalidRequest("the time range is empty")
        per_supercuboid = (sx // self.tile_x) * (sy // self.tile_y) * self.grid.supercuboid[2]
        if per_supercuboid > MAX_TILES_PER_SUPERCUBOID:
            raise InvalidRequest(f"tiles of {self.tile_x}x{self.tile_y} make {per_supercuboid} tiles per supercuboid "
                                 f"({sx}x{sy}x{self.grid.supercuboid[2]}); at most {MAX_TILES_PER_SUPERCUBOID}: "
                                 "take larger tiles")

    def max_tile_bytes(self, itemsize: int) -> int:
        """The largest tile file a job takes: its voxels twice over plus TILE_FRAMING_BYTES."""
        return 2 * self.tile_x * self.tile_y * itemsize + TILE_FRAMING_BYTES

    # -- tiles ---------------------------------------------------------------------------------
    def _index_range(self, axis: int, size: int) -> range:
        return range(self.box.lo[axis] // size, -(-self.box.hi[axis] // size))

    def tile_box(self, tile: TileRef) -> Box:
        """The voxels a tile contributes: its tile-grid square at its z, clipped to the box."""
        lo = (tile.x_index * self.tile_x, tile.y_index * self.tile_y, tile.z)
        full = Box(lo, (lo[0] + self.tile_x, lo[1] + self.tile_y, tile.z + 1))
        clipped = full.intersect(self.box)
        if clipped is None:
            raise InvalidRequest(f"tile {tile} lies outside the ingest box {self.box}")
        return clipped

    def tile_count(self) -> int:
        per_slice = len(self._index_range(0, self.tile_x)) * len(self._index_range(1, self.tile_y))
        return per_slice * (self.box.hi[2] - self.box.lo[2]) * len(self.times)

    def supercuboid_of(self, tile: TileRef) -> SupercuboidRef:
        sx, sy, sz = self.grid.supercuboid
        return SupercuboidRef(tile.t, (tile.x_index * self.tile_x // sx, tile.y_index * self.tile_y // sy,
                                       tile.z // sz))

    # -- supercuboids --------------------------------------------------------------------------
    def supercuboids(self, start: int = 0) -> Iterator[SupercuboidRef]:
        """The job's supercuboids in manifest order (t, then z, y, x), from the `start`-th."""
        for number in range(start, self.supercuboid_count()):
            yield self.supercuboid_at(number)

    def supercuboid_at(self, number: int) -> SupercuboidRef:
        """The `number`-th supercuboid of the manifest order, in O(1)."""
        lo, hi = self.grid.index_range(self.box)
        rest, index = number, []
        for axis in (0, 1, 2):
            rest, i = divmod(rest, hi[axis] - lo[axis])
            index.append(lo[axis] + i)
        return SupercuboidRef(self.times[rest], (index[0], index[1], index[2]))

    def supercuboid_count(self) -> int:
        lo, hi = self.grid.index_range(self.box)
        return (hi[0] - lo[0]) * (hi[1] - lo[1]) * (hi[2] - lo[2]) * len(self.times)

    def region_of(self, sc: SupercuboidRef) -> Box:
        """The part of a supercuboid this job writes; InvalidRequest for one it does not touch."""
        region = self.grid.supercuboid_box(sc.index).intersect(self.box)
        if region is None or sc.t not in self.times:
            raise InvalidRequest(f"supercuboid {sc.index} lies outside the ingest box {self.box}")
        return region

    def _tile_ranges(self, sc: SupercuboidRef) -> tuple[range, range, range]:
        region = self.region_of(sc)
        xs = range(region.lo[0] // self.tile_x, -(-region.hi[0] // self.tile_x))
        ys = range(region.lo[1] // self.tile_y, -(-region.hi[1] // self.tile_y))
        return xs, ys, range(region.lo[2], region.hi[2])

    def tiles_of(self, sc: SupercuboidRef) -> list[TileRef]:
        """The tiles of one supercuboid, in ordinal order."""
        xs, ys, zs = self._tile_ranges(sc)
        return [TileRef(sc.t, z, y, x) for z in zs for y in ys for x in xs]

    def tile_count_of(self, sc: SupercuboidRef) -> int:
        xs, ys, zs = self._tile_ranges(sc)
        return len(xs) * len(ys) * len(zs)

    def ordinal(self, tile: TileRef) -> int:
        """The tile's number among its supercuboid's tiles (the order of `tiles_of`)."""
        try:
            xs, ys, zs = self._tile_ranges(self.supercuboid_of(tile))
        except InvalidRequest:
            xs = ys = zs = range(0)
        if tile.x_index not in xs or tile.y_index not in ys or tile.z not in zs or tile.t not in self.times:
            raise InvalidRequest(f"tile {tile} is not part of this ingest")
        return ((tile.z - zs.start) * len(ys) + tile.y_index - ys.start) * len(xs) + tile.x_index - xs.start

    def manifest(self, start: int = 0) -> Iterator[TileRef]:
        """Every tile of the job from the `start`-th, a supercuboid's tiles together, so
        supercuboids complete (and the pipeline's later phases start) while the upload is still
        running. Finding where to start costs O(1), not O(start)."""
        if start >= self.tile_count():
            return
        number, within = self.locate(start)
        yield from self.tiles_of(self.supercuboid_at(number))[within:]
        for sc in self.supercuboids(number + 1):
            yield from self.tiles_of(sc)

    # -- positions in the manifest, by arithmetic ------------------------------------------------
    # Along one axis, the job's tiles in the first k supercuboids of the box number
    # ceil(min(end of the k-th, box end) / tile) - box start / tile: the box starts on the tile
    # grid and a tile divides a supercuboid, so the counts of neighbouring supercuboids add up.
    def _axis(self, axis: int) -> tuple[int, int, int, int]:
        """(first supercuboid index, supercuboid size, tile size, first tile index) on an axis."""
        unit = (self.tile_x, self.tile_y, 1)[axis]
        size = self.grid.supercuboid[axis]
        return self.box.lo[axis] // size, size, unit, self.box.lo[axis] // unit

    def _before(self, axis: int, k: int) -> int:
        """Tiles (slices, along z) of the box in its first k supercuboids along `axis`."""
        first, size, unit, start = self._axis(axis)
        end = min(max((first + k) * size, self.box.lo[axis]), self.box.hi[axis])
        return -(-end // unit) - start

    def _column(self, axis: int, units: int) -> int:
        """Which supercuboid (counted from the box's first) holds the `units`-th tile of an axis."""
        first, size, unit, start = self._axis(axis)
        return (start + units) * unit // size - first

    def offset_of(self, sc: SupercuboidRef) -> int:
        """How many tiles of the manifest come before the supercuboid's first."""
        lo, _ = self.grid.index_range(self.box)
        k = [sc.index[a] - lo[a] for a in (0, 1, 2)]
        totals = [self._before(a, self.grid.index_range(self.box)[1][a] - lo[a]) for a in (0, 1, 2)]
        counts = [self._before(a, k[a] + 1) - self._before(a, k[a]) for a in (0, 1, 2)]
        per_time = totals[0] * totals[1] * totals[2]
        return (self.times.index(sc.t) * per_time + self._before(2, k[2]) * totals[1] * totals[0]
                + counts[2] * self._before(1, k[1]) * totals[0] + counts[2] * counts[1] * self._before(0, k[0]))

    def locate(self, offset: int) -> tuple[int, int]:
        """(the number of the supercuboid that holds the manifest's `offset`-th tile, its place
        among that supercuboid's tiles), in O(1)."""
        lo, hi = self.grid.index_range(self.box)
        totals = [self._before(a, hi[a] - lo[a]) for a in (0, 1, 2)]
        t, rest = divmod(offset, totals[0] * totals[1] * totals[2])
        kz = self._column(2, rest // (totals[1] * totals[0]))
        rest -= self._before(2, kz) * totals[1] * totals[0]
        cz = self._before(2, kz + 1) - self._before(2, kz)
        ky = self._column(1, rest // (cz * totals[0]))
        rest -= cz * self._before(1, ky) * totals[0]
        cy = self._before(1, ky + 1) - self._before(1, ky)
        kx = self._column(0, rest // (cz * cy))
        rest -= cz * cy * self._before(0, kx)
        number = ((t * (hi[2] - lo[2]) + kz) * (hi[1] - lo[1]) + ky) * (hi[0] - lo[0]) + kx
        return number, rest


def tile_key(job_id: int, tile: TileRef, file_format: str) -> str:
    """The tile's object key in the tile bucket; the job's tiles share the prefix `<job>/`."""
    return f"{job_id}/{tile.t}/{tile.z}/{tile.y_index}/{tile.x_index}.{TILE_FORMATS[file_format]}"


def parse_tile_key(key: str) -> tuple[int, TileRef]:
    parts = key.split("/")
    if len(parts) != 5 or "." not in parts[4]:
        raise ValueError(f"not a tile key: {key!r}")
    numbers = [*parts[:4], parts[4].split(".", 1)[0]]
    if not all(p.isascii() and p.isdigit() for p in numbers):
        raise ValueError(f"not a tile key: {key!r}")
    job, t, z, y, x = (int(p) for p in numbers)
    return job, TileRef(t, z, y, x)


def decode_tile(body: bytes, what: str, full_yx: tuple[int, int], clipped_yx: tuple[int, int],
                dtype: np.dtype) -> npt.NDArray[Any]:
    """A tile's pixels as a (y, x) array of the channel's dtype, cropped to the box. The image
    may be the full tile size (the part past the box is dropped) or exactly the clipped size;
    any other size, a colour image, or values the dtype cannot hold are an InvalidBody naming
    `what` (the tile)."""
    try:
        with Image.open(io.BytesIO(body)) as image:
            # The size its header claims, before decoding: a small file may claim gigapixels.
            _check_tile_size((image.size[1], image.size[0]), what, full_yx, clipped_yx)
            image.load()
            pixels = np.asarray(image)
    except InvalidBody:
        raise
    except Exception as exc:  # Pillow raises OSError, SyntaxError, struct.error, EOFError... on corrupt files
        raise InvalidBody(f"{what} is not a readable PNG/TIFF image: {exc}") from exc
    if pixels.ndim != 2:
        raise InvalidBody(f"{what} has {pixels.shape[2] if pixels.ndim == 3 else pixels.ndim} channels; "
                          "tiles must be single-channel (greyscale) images")
    _check_tile_size(pixels.shape, what, full_yx, clipped_yx)
    pixels = pixels[: clipped_yx[0], : clipped_yx[1]]
    return _as_dtype(pixels, dtype, what)


def _check_tile_size(yx: tuple[int, ...], what: str, full_yx: tuple[int, int], clipped_yx: tuple[int, int]) -> None:
    if tuple(yx) not in (full_yx, clipped_yx):
        raise InvalidBody(f"{what} is {yx[1]}x{yx[0]} pixels; expected "
                          f"{full_yx[1]}x{full_yx[0]} (or {clipped_yx[1]}x{clipped_yx[0]} at the box edge)")


def _as_dtype(pixels: npt.NDArray[Any], dtype: np.dtype, what: str) -> npt.NDArray[Any]:
    if pixels.dtype == dtype:
        return pixels
    if pixels.dtype == np.bool_:
        return pixels.astype(dtype)
    if dtype.kind == "f":
        return pixels.astype(dtype)
    if pixels.dtype.kind in "iu" and dtype.kind in "iu" and pixels.size:
        info = np.iinfo(dtype)
        low, high = int(pixels.min()), int(pixels.max())
        if low >= info.min and high <= info.max:
            return pixels.astype(dtype)
        raise InvalidBody(f"{what} holds values {low}..{high} that a {dtype.name} channel cannot store")
    raise InvalidBody(f"{what} has {pixels.dtype.name} pixels; the channel stores {dtype.name}")


def encode_tile(pixels: npt.NDArray[Any], file_format: str) -> bytes:
    """A (y, x) array as a PNG or TIFF file (for tests, demos and benchmarks)."""
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG" if TILE_FORMATS[file_format] == "png" else "TIFF")
    return out.getvalue()
