"""Skeletons of a label channel, pure: `skeleton_fragment` skeletonizes one supercuboid with
kimimaro into the fragment object stored for it (every label's piece), `piece_of` pulls one
label's piece out of such an object without decoding the others, and `merge_skeleton` merges a
label's pieces into Neuroglancer's precomputed skeleton file (`info` for its info).

A supercuboid's block reaches one voxel past its high sides (SEG_SPEC: the rebuild reads it so),
and kimimaro places an endpoint on each face where a label crosses it (`fix_borders`), from that
face's voxels alone: two neighbours skeletonize their shared plane alike, so their pieces share
vertices there, which `merge_skeleton` welds (osteoid's consolidate); kimimaro's postprocess then
joins what is still apart by less than the radii (a piece too small to skeletonize, dust).

Coordinates are nanometres of level 0 from the volume's origin (voxel * voxel_nm, Neuroglancer's
"model" space), so the info's transform is the identity. Radii are nanometres (kimimaro's
distance to the boundary).

Fragment object: `uint32 n` (little-endian) then n bytes of JSON header
`{"format": FORMAT, "labels": L, "vertices": V, "edges": E}`, then raw little-endian arrays:
labels uint64[L] (ascending), vertex counts uint32[L], edge counts uint32[L], vertices
float32[V, 3] (x, y, z), radius float32[V], edges uint32[E, 2] (indices into the label's own
vertices); each label's vertices and edges follow the last's. Nothing in it is executable.

Cost (docs/design/segmentation.md): kimimaro spends ~2.3-3.5 us per voxel of the labels it
skeletonizes on one core, whatever the TEASAR parameters (its invalidation pass scans each
label's box once per path), so a dense 512x512x8 uint64 supercuboid takes ~5.5 s and the bound
is on those voxels; a checkerboard of one-voxel labels is dust and costs one fastremap pass
(~20 ms). Merging a label's pieces costs ~1 ms per thousand vertices.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import fastremap
import kimimaro
import kimimaro.post as kimimaro_post
import numpy as np
import numpy.typing as npt
from osteoid import Skeleton
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import minimum_spanning_tree

from ndstore.core.errors import DataCorrupt
from ndstore.core.geometry import XYZ, Box
from ndstore.core.segments.bounds import Skipped
from ndstore.core.segments.shards import ShardSpec, shard_file

FORMAT = "ndstore-skeleton-fragment-1"
MAX_HEADER_BYTES = 1 << 12
RADIUS = {"id": "radius", "data_type": "float32", "num_components": 1}
# kimimaro's TEASAR parameters (nm): its defaults, tuned for EM neurons at 4x4x40 nm; scale and
# const barely change the time (measured 1.0/100 .. 3/0: within 15%), so the defaults stand
TEASAR: dict[str, float] = {
    "scale": 1.5, "const": 300, "pdrf_scale": 100000, "pdrf_exponent": 4, "soma_acceptance_threshold": 3500,
    "soma_detection_threshold": 750, "soma_invalidation_const": 300, "soma_invalidation_scale": 2,
}


@dataclass(frozen=True)
class SkeletonBounds:
    """A supercuboid's skeletons are skipped past any of these (measured before kimimaro runs).
    `dust_threshold`: a label (a connected piece, for kimimaro) of no more voxels is not
    skeletonized in this supercuboid. `max_voxels`: voxels of the labels to skeletonize, which
    predict kimimaro's time (2.3-3.5 us each on one core here, dense cells, tubes or thin
    ribbons whose boxes span the block alike): the default lets the largest supercuboid through
    whole (512x512x64 uint8 and its overlap: 17.1M voxels, ~50 s), a dense uint64 one (2.4M) takes
    ~5.5 s, a uint32 one (4.5M) ~10 s. `max_labels`: labels to skeletonize (each a few ms of
    set-up and a piece in the fragment). `max_block_voxels`: the block itself (kimimaro holds
    ~20 bytes a voxel: 2^25 voxels ~ 0.7 GiB)."""

    dust_threshold: int = 1000
    max_labels: int = 2000
    max_voxels: int = 18_000_000
    max_block_voxels: int = 1 << 25


class SkeletonPiece(NamedTuple):
    """One label's skeleton (or a piece of it): vertices float32 (n, 3) x y z nm, edges uint32
    (m, 2) indices into vertices, radius float32 (n,) nm."""

    vertices: npt.NDArray[np.float32]
    edges: npt.NDArray[np.uint32]
    radius: npt.NDArray[np.float32]


def labels_to_skeletonize(block: npt.NDArray[Any], bounds: SkeletonBounds) -> npt.NDArray[Any]:
    """The labels with more than dust_threshold voxels (0 excluded); Skipped past the bounds.
    One fastremap pass (~40 ms for 2M voxels, even of a million labels)."""
    if block.size > bounds.max_block_voxels:
        raise Skipped(f"a block of {block.size} voxels: over the {bounds.max_block_voxels} a supercuboid's "
                      "skeletons may take")
    labels, counts = fastremap.unique(block, return_counts=True)
    keep = (counts > bounds.dust_threshold) & (labels != 0)
    kept: npt.NDArray[Any] = labels[keep]
    voxels = int(counts[keep].sum())
    if len(kept) > bounds.max_labels:
        raise Skipped(f"{len(kept)} labels of more than {bounds.dust_threshold} voxels: over the "
                      f"{bounds.max_labels} a supercuboid's skeletons may cost")
    if voxels > bounds.max_voxels:
        raise Skipped(f"{voxels} voxels of labels to skeletonize: over the {bounds.max_voxels} a supercuboid's "
                      "skeletons may cost")
    return kept


def skeletonize(block: npt.NDArray[Any], labels: npt.NDArray[Any], voxel_nm: tuple[float, float, float],
                dust_threshold: int) -> dict[int, Skeleton]:
    """kimimaro on a (z, y, x) block, these labels only; vertices in nm from the block's origin."""
    if len(labels) == 0:
        return {}
    skeletons: dict[int, Skeleton] = kimimaro.skeletonize(
        block.T, teasar_params=TEASAR, anisotropy=voxel_nm, object_ids=[int(v) for v in labels],
        dust_threshold=dust_threshold, fix_branching=True, fix_borders=True, progress=False, parallel=1)
    return skeletons


def skeleton_fragment(block: npt.NDArray[Any], box: Box, cell: XYZ, voxel_nm: tuple[float, float, float],
                      bounds: SkeletonBounds = SkeletonBounds()) -> bytes | None:
    """The fragment object of a supercuboid (``box``, level-0 voxels) from its ``block`` (z, y, x:
    the box and a one-voxel overlap on its high sides where the extent continues): every label's
    skeleton piece, in nm of the volume; None when no label is skeletonized; Skipped past ``bounds``."""
    del cell  # the block's own box places it; the grid is the rebuild's
    if block.ndim != 3 or any(b - s not in (0, 1) for b, s in zip(block.shape, box.shape_zyx)):
        raise ValueError(f"a block of shape {block.shape} for a box of {box.shape_zyx} (z y x): it must be the box "
                         "and at most one voxel more on each high side")
    labels = labels_to_skeletonize(block, bounds)
    skeletons = skeletonize(block, labels, voxel_nm, bounds.dust_threshold)
    origin = np.array(box.lo, np.float64) * np.array(voxel_nm, np.float64)
    pieces = {}
    for label, skel in skeletons.items():
        if len(skel.vertices):
            vertices = (skel.vertices.astype(np.float64) + origin).astype(np.float32)
            pieces[int(label)] = SkeletonPiece(vertices, skel.edges.astype(np.uint32), skel.radius.astype(np.float32))
    return encode_fragment(pieces) if pieces else None


def encode_fragment(pieces: dict[int, SkeletonPiece]) -> bytes:
    """The fragment object holding these labels' pieces."""
    labels = sorted(pieces)
    parts = [pieces[label] for label in labels]
    header = json.dumps({"format": FORMAT, "labels": len(labels), "vertices": sum(len(p.vertices) for p in parts),
                         "edges": sum(len(p.edges) for p in parts)}).encode()
    arrays = [np.array(labels, "<u8"), np.array([len(p.vertices) for p in parts], "<u4"),
              np.array([len(p.edges) for p in parts], "<u4"),
              *[np.asarray(p.vertices, "<f4").reshape(-1, 3) for p in parts],
              *[np.asarray(p.radius, "<f4").reshape(-1) for p in parts],
              *[np.asarray(p.edges, "<u4").reshape(-1, 2) for p in parts]]
    return b"".join([struct.pack("<I", len(header)), header, *(a.tobytes() for a in arrays)])


class _Layout(NamedTuple):
    labels: npt.NDArray[np.uint64]
    vertex_counts: npt.NDArray[np.uint32]
    edge_counts: npt.NDArray[np.uint32]
    vertices_at: int  # byte offsets of the sections
    radius_at: int
    edges_at: int


def _layout(blob: bytes) -> _Layout:
    """The fragment's index (labels and counts); DataCorrupt where the object is not one."""
    try:
        (size,) = struct.unpack_from("<I", blob)
        if size > MAX_HEADER_BYTES:
            raise ValueError(f"a header of {size} bytes")
        header = json.loads(blob[4:4 + size])
        n, nv, ne = (int(header[k]) for k in ("labels", "vertices", "edges"))
        if header.get("format") != FORMAT or min(n, nv, ne) < 0:
            raise ValueError(f"header {header!r}")
        at = 4 + size
        labels = np.frombuffer(blob, "<u8", n, at)
        vertex_counts = np.frombuffer(blob, "<u4", n, at + 8 * n)
        edge_counts = np.frombuffer(blob, "<u4", n, at + 12 * n)
    except (ValueError, TypeError, KeyError, struct.error) as exc:
        raise DataCorrupt(f"a stored skeleton fragment cannot be read: {exc}") from exc
    vertices_at = at + 16 * n
    radius_at = vertices_at + 12 * nv
    edges_at = radius_at + 4 * nv
    if int(vertex_counts.sum()) != nv or int(edge_counts.sum()) != ne or edges_at + 8 * ne != len(blob):
        raise DataCorrupt("a stored skeleton fragment cannot be read: its counts do not match its size")
    return _Layout(labels, vertex_counts, edge_counts, vertices_at, radius_at, edges_at)


def fragment_labels(blob: bytes) -> npt.NDArray[np.uint64]:
    """The labels that have a piece in this fragment object, ascending."""
    return _layout(blob).labels


def piece_of(blob: bytes, label: int) -> SkeletonPiece | None:
    """``label``'s piece of a fragment object (None when it has none): the index and that piece
    are read, the other labels' arrays are not."""
    layout = _layout(blob)
    i = int(np.searchsorted(layout.labels, np.uint64(label)))
    if i == len(layout.labels) or int(layout.labels[i]) != label:
        return None
    v0, e0 = int(layout.vertex_counts[:i].sum()), int(layout.edge_counts[:i].sum())
    nv, ne = int(layout.vertex_counts[i]), int(layout.edge_counts[i])
    vertices = np.frombuffer(blob, "<f4", 3 * nv, layout.vertices_at + 12 * v0).reshape(nv, 3)
    radius = np.frombuffer(blob, "<f4", nv, layout.radius_at + 4 * v0)
    edges = np.frombuffer(blob, "<u4", 2 * ne, layout.edges_at + 8 * e0).reshape(ne, 2)
    if ne and int(edges.max()) >= nv:
        raise DataCorrupt(f"a stored skeleton fragment cannot be read: label {label}'s edges name missing vertices")
    return SkeletonPiece(vertices, edges, radius)


def _tree(skel: Skeleton) -> Skeleton:
    """The skeleton with its loops broken: a minimum spanning forest of its edges by length."""
    n = len(skel.vertices)
    if len(skel.edges) < n:  # a forest has fewer edges than vertices: no loop
        return skel
    a, b = skel.edges[:, 0].astype(np.int64), skel.edges[:, 1].astype(np.int64)
    length = np.linalg.norm(skel.vertices[a] - skel.vertices[b], axis=1) + 1e-6  # 0 would read as no edge
    forest = minimum_spanning_tree(coo_matrix((length, (a, b)), shape=(n, n))).tocoo()
    skel.edges = np.stack([forest.row, forest.col], axis=1).astype(np.uint32)
    return skel


def merge_skeleton(pieces: Iterable[SkeletonPiece]) -> bytes | None:
    """One label's skeleton file (Neuroglancer precomputed: uint32 vertices, uint32 edges, float32
    x y z per vertex, uint32 pairs, then float32 radius per vertex) from its pieces: concatenated,
    vertices that coincide welded, loops removed and components closer than their radii joined
    (kimimaro's postprocess, as igneous merges its chunks). None when there is nothing."""
    parts = [Skeleton(np.array(p.vertices, np.float32), np.array(p.edges, np.uint32),
                      radii=np.array(p.radius, np.float32), space="physical")
             for p in pieces if len(p.vertices)]
    if not parts:
        return None
    merged = Skeleton.simple_merge(parts).consolidate(remove_disconnected_vertices=False)
    if len(merged.vertices) > 1:
        # kimimaro.postprocess's steps without dust and tick removal (thresholds 0), but loops
        # broken by a minimum spanning tree: kimimaro's remove_loops drops every edge of a
        # component that is one loop (pieces of a flat segment meeting around a seam), and its
        # join_close_components wants the skeleton in a list.
        merged = _tree(merged.consolidate())
        merged = kimimaro_post.join_close_components([merged], restrict_by_radius=True).consolidate()
    merged.extra_attributes = [dict(RADIUS)]
    encoded: bytes = merged.to_precomputed()
    return encoded


def info(sharding: dict[str, Any] | None = None) -> dict[str, Any]:
    """The skeletons' `info`: vertices already in nm (identity transform), a radius per vertex;
    ``sharding`` for the sharded form."""
    return {"@type": "neuroglancer_skeletons", "transform": [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0],
            "vertex_attributes": [dict(RADIUS)], "spatial_index": None,
            **({"sharding": sharding} if sharding is not None else {})}


# Sharded skeletons: a segment's shard is the low SHARD_BITS bits of its id (hash identity, no
# preshift, one minishard), so a shard holds 1/65536 of the labels: one or a few, whose
# skeletons are merged whenever the shard is read.
SHARDS = ShardSpec(shard_bits=16)


def shard_of(label: int) -> int:
    return SHARDS.shard_of(label)


def skeleton_of(blobs: Iterable[bytes], label: int) -> bytes | None:
    """``label``'s skeleton file from the fragment objects that may hold its pieces; None when
    none does. The same objects in the same order make the same bytes (where two pieces share a
    vertex, the first one's radius stands): give them in supercuboid order."""
    return merge_skeleton(piece for blob in blobs if (piece := piece_of(blob, label)) is not None)


def skeleton_shard(skeletons: dict[int, bytes]) -> bytes:
    """The shard file of these segments' skeleton files (all of one shard)."""
    return shard_file(skeletons, SHARDS)
