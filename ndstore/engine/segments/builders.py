"""The product builders a rebuild runs on each supercuboid, by kind (the cores in
ndstore/core/segments/). Each core is imported on its first build: zmesh and kimimaro (with
scipy) cost a web worker a second at start, most processes never build a product, and the
ingest and downsample Lambdas' package does not hold them (deploy/aws: the segments function's
does)."""

from __future__ import annotations

from ndstore.core.geometry import Box
from ndstore.engine.segments.upkeep import XYZ, Array, Builder, VoxelNm


def build_mesh(block: Array, box: Box, cell: XYZ, voxel_nm: VoxelNm, extent: Box) -> bytes | None:
    from ndstore.core.segments.mesh import mesh_fragment

    return mesh_fragment(block, box, cell, voxel_nm, extent=extent)  # capped where the volume ends


def build_skeleton(block: Array, box: Box, cell: XYZ, voxel_nm: VoxelNm, extent: Box) -> bytes | None:
    from ndstore.core.segments.skeleton import skeleton_fragment

    return skeleton_fragment(block, box, cell, voxel_nm)


def product_builders() -> dict[str, Builder]:
    return {"mesh": build_mesh, "skeleton": build_skeleton}
