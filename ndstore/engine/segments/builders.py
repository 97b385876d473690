"""The product builders a rebuild runs on each supercuboid, by kind (the cores in
ndstore/core/segments/). Each core is imported on its first build: zmesh and kimimaro (with
scipy) cost a web worker a second at start and most processes never build a product."""

from __future__ import annotations

import importlib
from typing import Any

from ndstore.core.geometry import Box
from ndstore.engine.segments.upkeep import XYZ, Array, Builder, VoxelNm

CORES = {"mesh": ("ndstore.core.segments.mesh", "mesh_fragment"),
         "skeleton": ("ndstore.core.segments.skeleton", "skeleton_fragment")}


class _OnFirstUse:
    def __init__(self, module: str, function: str):
        self.module = module
        self.function = function
        self._build: Any = None

    def __call__(self, block: Array, box: Box, cell: XYZ, voxel_nm: VoxelNm) -> bytes | None:
        if self._build is None:
            self._build = getattr(importlib.import_module(self.module), self.function)
        return self._build(block, box, cell, voxel_nm)  # type: ignore[no-any-return]


def product_builders() -> dict[str, Builder]:
    return {kind: _OnFirstUse(*where) for kind, where in CORES.items()}
