"""The product builders a rebuild runs on each supercuboid, by kind (the cores in
ndstore/core/segments/). Each core is imported on its first build: zmesh and kimimaro (with
scipy) cost a web worker a second at start and most processes never build a product."""

from __future__ import annotations

import importlib
from typing import Any

from ndstore.core.geometry import Box
from ndstore.engine.segments.upkeep import XYZ, Array, Builder, VoxelNm

CORES = {"mesh": ("ndstore.core.segments.mesh", "mesh_fragment", True),  # True: it takes the extent
         "skeleton": ("ndstore.core.segments.skeleton", "skeleton_fragment", False)}


class _OnFirstUse:
    def __init__(self, module: str, function: str, takes_extent: bool):
        self.module = module
        self.function = function
        self.takes_extent = takes_extent
        self._build: Any = None

    def __call__(self, block: Array, box: Box, cell: XYZ, voxel_nm: VoxelNm, extent: Box) -> bytes | None:
        if self._build is None:
            self._build = getattr(importlib.import_module(self.module), self.function)
        if self.takes_extent:  # meshes are capped where the volume ends
            return self._build(block, box, cell, voxel_nm, extent=extent)  # type: ignore[no-any-return]
        return self._build(block, box, cell, voxel_nm)  # type: ignore[no-any-return]


def product_builders() -> dict[str, Builder]:
    return {kind: _OnFirstUse(*where) for kind, where in CORES.items()}
