"""Meshing figures of one supercuboid: zmesh alone (mesh + get of every label, level 0, the
floor) beside ``mesh_fragment`` (every level of detail, node by node, and the Draco encoding),
with mesh_fragment's time split into zmesh, Draco and the rest. One core, no service.
For benchmarks/bench_segmentation.py to call (``measure``), or alone:

    python -m benchmarks.mesh_figures
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import zmesh

from ndstore.core.geometry import XYZ, Box
from ndstore.core.segments import mesh


def dense_labels(shape_zyx: tuple[int, int, int], labels: int, voxel_nm: tuple[float, float, float],
                 seed: int = 0) -> np.ndarray:
    """A dense segmentation: the Voronoi cells (in nm) of random seeds, labels far apart."""
    from scipy.spatial import cKDTree  # installed with kimimaro

    rng = np.random.default_rng(seed)
    seeds = rng.uniform(0, 1, (labels, 3)) * np.array(shape_zyx[::-1]) * np.array(voxel_nm)
    z, y, x = np.indices(shape_zyx)
    _, nearest = cKDTree(seeds).query(np.stack([x.ravel(), y.ravel(), z.ravel()], 1) * np.array(voxel_nm))
    return (nearest.reshape(shape_zyx) + 1).astype(np.uint64) * np.uint64(1000003)


@contextmanager
def timed(owner: Any, name: str, spent: dict[str, float], key: str) -> Iterator[None]:
    real: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kw: Any) -> Any:
        start = time.perf_counter()
        try:
            return real(*args, **kw)
        finally:
            spent[key] += time.perf_counter() - start

    setattr(owner, name, wrapper)
    try:
        yield
    finally:
        setattr(owner, name, real)


def measure(block: np.ndarray, box: Box, cell: XYZ, voxel_nm: tuple[float, float, float],
            reps: int = 3, extent: Box | None = None) -> dict[str, float]:
    """Best of ``reps``: seconds of zmesh alone and of mesh_fragment (its zmesh, Draco and the
    rest), MB/s of each over the block's bytes, and the fragment object's size. ``extent``:
    where the level's extent lies (a box on its face is capped there: more triangles)."""
    best: dict[str, float] = {}
    for _ in range(reps):
        start = time.perf_counter()
        mesher = zmesh.Mesher(voxel_nm)
        mesher.mesh(block.T, close=False)
        for label in mesher.ids():
            mesher.get(label, normals=False, reduction_factor=0)
        alone = time.perf_counter() - start
        spent = {"zmesh": 0.0, "draco": 0.0}
        with timed(mesh.DracoPy, "encode", spent, "draco"), timed(zmesh.Mesher, "mesh", spent, "zmesh"), \
                timed(zmesh.Mesher, "get", spent, "zmesh"):
            start = time.perf_counter()
            blob = mesh.mesh_fragment(block, box, cell, voxel_nm, extent=extent)
            total = time.perf_counter() - start
        if not best or total < best["mesh_fragment_s"]:
            best = {"zmesh_alone_s": alone, "mesh_fragment_s": total, "its_zmesh_s": spent["zmesh"],
                    "its_draco_s": spent["draco"], "object_bytes": float(len(blob or b""))}
    mb = block.nbytes / 1e6
    best["zmesh_alone_mb_s"] = mb / best["zmesh_alone_s"]
    best["mesh_fragment_mb_s"] = mb / best["mesh_fragment_s"]
    best["meshing_ratio"] = best["zmesh_alone_s"] / (best["mesh_fragment_s"] - best["its_draco_s"])
    return best


def main() -> None:
    aniso, iso = (4.0, 4.0, 40.0), (8.0, 8.0, 8.0)
    cases = [("uint64 512x512x8, 400 labels", dense_labels((9, 513, 513), 400, aniso), (512, 512, 8), aniso),
             ("uint64 128^3 isotropic, 60 labels", dense_labels((129, 129, 129), 60, iso, 1), (128, 128, 128), iso)]
    for name, block, cell, voxel in cases:
        inside = Box(cell, (2 * cell[0], 2 * cell[1], 2 * cell[2]))  # an inner supercuboid: no face to cap
        f = measure(block, inside, cell, voxel, extent=Box((0, 0, 0), (3 * cell[0], 3 * cell[1], 3 * cell[2])))
        print(f"{name}: zmesh alone {f['zmesh_alone_s'] * 1e3:.0f} ms ({f['zmesh_alone_mb_s']:.1f} MB/s); "
              f"mesh_fragment {f['mesh_fragment_s'] * 1e3:.0f} ms ({f['mesh_fragment_mb_s']:.1f} MB/s): zmesh "
              f"{f['its_zmesh_s'] * 1e3:.0f}, Draco {f['its_draco_s'] * 1e3:.0f}; meshing (all but Draco) at "
              f"{f['meshing_ratio']:.2f} of zmesh alone; object {f['object_bytes'] / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
