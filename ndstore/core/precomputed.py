"""Neuroglancer "precomputed" volumes: a channel's `info` JSON, scale keys, chunk encodings.

Pure: the scales come from ndstore.core.geometry (the same per-level extent and cuboid shape
the engine uses), the encodings are functions of a (z, y, x) C-order numpy array. The spec:
neuroglancer `src/datasource/precomputed/volume.md`. Precomputed arrays are (x, y, z) with x
fastest (Fortran order), which is byte for byte our (z, y, x) C order.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ndstore.core.errors import InvalidRequest, NotFound
from ndstore.core.geometry import XYZ, Box, Grid, HierarchyMethod, level_extent

RAW = "raw"
COMPRESSED_SEGMENTATION = "compressed_segmentation"
ENCODINGS = (RAW, COMPRESSED_SEGMENTATION)
CSEG_BLOCK: XYZ = (8, 8, 8)
SEGMENTATION_DTYPES = ("uint32", "uint64")

# A coordinate frame's voxel unit -> nanometres (precomputed resolutions are in nm).
NANOMETERS_PER = {"nanometers": 1.0, "micrometers": 1e3, "millimeters": 1e6, "centimeters": 1e7}


class PrecomputedVolume(Protocol):
    """What the info needs of a channel (ndstore.engine.volume.ChannelVolume has it all)."""

    @property
    def dtype(self) -> np.dtype: ...
    @property
    def frame(self) -> Box: ...
    @property
    def num_levels(self) -> int: ...
    @property
    def method(self) -> HierarchyMethod: ...
    @property
    def annotation(self) -> bool: ...

    def grid(self, resolution: int) -> Grid: ...


def cseg_available() -> bool:
    """compressed_segmentation is served only where the `compressed-segmentation` codec is installed."""
    return importlib.util.find_spec("compressed_segmentation") is not None


def voxel_size_nm(size: tuple[float, float, float], unit: str) -> tuple[float, float, float]:
    if unit not in NANOMETERS_PER:
        raise InvalidRequest(f"voxel unit {unit!r} has no conversion to nanometers")
    f = NANOMETERS_PER[unit]
    return (size[0] * f, size[1] * f, size[2] * f)


def scale_key(level: int) -> str:
    return str(level)


def level_of_key(key: str, num_levels: int) -> int:
    """The resolution level a scale key names; a key that names none is a 404 (no such file)."""
    if key.isascii() and key.isdigit() and scale_key(int(key)) == key and int(key) < num_levels:
        return int(key)
    raise NotFound(f"scale key {key!r} does not exist: this channel's scale keys are 0..{num_levels - 1}")


def default_encoding(volume: PrecomputedVolume) -> str:
    """compressed_segmentation for label channels where the codec is installed, raw otherwise."""
    if volume.annotation and volume.dtype.name in SEGMENTATION_DTYPES and cseg_available():
        return COMPRESSED_SEGMENTATION
    return RAW


def check_encoding(encoding: str, volume: PrecomputedVolume) -> str:
    if encoding not in ENCODINGS:
        raise NotFound(f"encoding {encoding!r} is not served: use one of {', '.join(ENCODINGS)}")
    if encoding == COMPRESSED_SEGMENTATION:
        if not volume.annotation or volume.dtype.name not in SEGMENTATION_DTYPES:
            raise InvalidRequest("compressed_segmentation applies to uint32/uint64 annotation channels only")
        if not cseg_available():
            raise InvalidRequest("compressed_segmentation is not available: the codec is not installed")
    return encoding


def scale_info(volume: PrecomputedVolume, level: int, voxel_nm: tuple[float, float, float],
               encoding: str) -> dict[str, Any]:
    """One entry of `scales`: the level's extent as the engine sees it (rounded outward), its
    voxel size, and one chunk per cuboid of the level's grid."""
    extent = level_extent(volume.frame, level, volume.method)
    factor = 1 << level
    factors = (factor, factor, factor if volume.method == "isotropic" else 1)
    scale: dict[str, Any] = {
        "key": scale_key(level),
        "size": [b - a for a, b in zip(extent.lo, extent.hi)],
        "voxel_offset": list(extent.lo),
        "resolution": [v * f for v, f in zip(voxel_nm, factors)],
        "chunk_sizes": [list(volume.grid(level).cuboid)],
        "encoding": encoding,
    }
    if encoding == COMPRESSED_SEGMENTATION:
        scale["compressed_segmentation_block_size"] = list(CSEG_BLOCK)
    return scale


PRODUCTS = {"mesh": "mesh", "skeletons": "skeletons", "segment_properties": "segment_properties"}


def info(volume: PrecomputedVolume, voxel_nm: tuple[float, float, float], encoding: str,
         levels: Sequence[int], products: bool = False) -> dict[str, Any]:
    """The `info` JSON of a channel: one scale per level of `levels` (those that hold data),
    finest first; with ``products`` (a label channel's), the directories of its segmentation
    products, relative to the info."""
    return {
        "@type": "neuroglancer_multiscale_volume",
        "type": "segmentation" if volume.annotation else "image",
        "data_type": volume.dtype.name,
        "num_channels": 1,
        "scales": [scale_info(volume, level, voxel_nm, encoding) for level in levels],
        **(PRODUCTS if products and volume.annotation else {}),
    }


def chunk_name(box: Box) -> str:
    """`{x0}-{x1}_{y0}-{y1}_{z0}-{z1}`, the name of a chunk file."""
    return "_".join(f"{a}-{b}" for a, b in zip(box.lo, box.hi))


def encode_chunk(data_zyx: npt.NDArray[Any], encoding: str) -> bytes:
    """A chunk's file: `raw` is little-endian voxels, x fastest; `compressed_segmentation` uses
    CSEG_BLOCK blocks over the same (x, y, z) array."""
    little = np.ascontiguousarray(data_zyx, dtype=data_zyx.dtype.newbyteorder("<"))
    if encoding == RAW:
        return little.tobytes()
    if encoding == COMPRESSED_SEGMENTATION:
        import compressed_segmentation

        encoded: bytes = compressed_segmentation.compress(little.T, block_size=CSEG_BLOCK, order="F")
        return encoded
    raise InvalidRequest(f"encoding {encoding!r} is not one of {', '.join(ENCODINGS)}")
