"""What a supercuboid may cost to build a product of, measured before the costly call.

`Skipped` is raised past the bounds (the rebuild records its message and stores nothing);
the measures are cheap numpy/fastremap passes over the block: a few milliseconds for a
512x512x8 uint64 supercuboid, where meshing it takes tens to hundreds.
"""

from __future__ import annotations

from dataclasses import dataclass

import fastremap
import numpy as np


class Skipped(Exception):
    """A supercuboid too costly to build a product of; the message says why."""


@dataclass(frozen=True)
class MeshBounds:
    """Past either, a supercuboid's meshes are skipped. The rebuild's time grows with the faces
    between differing voxels (zmesh makes two triangles of each; Draco encodes every one, which
    is most of the time) and with the labels (a zmesh `get` and a Draco encode per label and
    octree node). Measured on one shared core (docs/design/meshes.md, "Measurements"): dense
    512x512x8 uint64 segmentations of 400 / 2,000 / 10,000 labels have 0.74M / 1.3M / 2.1M such
    faces and take 3 / 7.6 / 14 s, under 310 MB; a checkerboard has 6.0M. So 2M faces bound a
    task to ~15 s of a core."""

    max_labels: int = 20_000
    max_boundary_faces: int = 2_000_000


def boundary_faces(block: np.ndarray) -> int:
    """Faces between neighbouring voxels whose labels differ (the surface zmesh will build)."""
    faces = 0
    for axis in range(block.ndim):
        if block.shape[axis] > 1:
            low = [slice(None)] * block.ndim
            high = [slice(None)] * block.ndim
            low[axis], high[axis] = slice(None, -1), slice(1, None)
            faces += int(np.count_nonzero(block[tuple(low)] != block[tuple(high)]))
    return faces


def labels_of(block: np.ndarray) -> np.ndarray:
    """The labels in the block, 0 (background) excluded, sorted."""
    labels = np.asarray(fastremap.unique(block))
    out: np.ndarray = labels[labels != 0]
    return out


def check_mesh_bounds(block: np.ndarray, bounds: MeshBounds) -> np.ndarray:
    """The block's labels; Skipped when meshing it would cost more than ``bounds`` allow.
    The surface is measured first: on a checkerboard it answers before counting labels."""
    faces = boundary_faces(block)
    if faces > bounds.max_boundary_faces:
        raise Skipped(f"{faces} faces between differing voxels: over the {bounds.max_boundary_faces} a supercuboid's "
                      "meshes may cost")
    labels = labels_of(block)
    if len(labels) > bounds.max_labels:
        raise Skipped(f"{len(labels)} labels: over the {bounds.max_labels} a supercuboid's meshes may cost")
    return labels
