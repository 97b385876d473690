"""The region the direct-I/O benchmarks read and write (bench_direct, s3_parts; bench_cache takes
its size): one anisotropic level-0 supercuboid of EM-like uint8 voxels per client thread."""

from __future__ import annotations

import blosc
import numpy as np
import numpy.typing as npt

from ndstore.core.chunks import encode_supercuboid
from ndstore.core.geometry import grid_for_level
from ndstore.core.synthetic import em_like

GRID = grid_for_level("anisotropic", 0, 1)
SC = GRID.supercuboid  # (512, 512, 64) voxels, x y z
REGION_BYTES = SC[0] * SC[1] * SC[2]


def workload(threads: int) -> tuple[list[npt.NDArray[np.uint8]], list[bytes], list[bytes]]:
    """Per thread: the EM-like volume, its blosc wire body, and its base-tier object."""
    volumes = [em_like((SC[2], SC[1], SC[0]), seed=i) for i in range(threads)]
    bodies = [blosc.compress(v, typesize=1, cname="lz4", clevel=5) for v in volumes]
    objects = [encode_supercuboid(v, GRID.cuboid, GRID.cuboids_per_super) or b"" for v in volumes]
    return volumes, bodies, objects
