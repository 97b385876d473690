"""Meshes of a label channel, pure: one supercuboid's fragment object (every label's
Draco-encoded octree nodes, at every level of detail) and Neuroglancer's
`neuroglancer_multilod_draco` files built from those objects when asked for: a segment's
manifest and fragment data (unsharded), a `neuroglancer_uint64_sharded_v1` shard of segments.

Coordinates. zmesh puts voxel ``i``'s sample at ``i`` (vertices on the marching-cubes surface,
half-way between samples), so the "stored model" space here is level-0 voxel index space:
a voxel's centre is at its index, and the info's transform maps ``p`` to ``(p + 0.5) * voxel_nm``
(voxel ``i`` spans ``[i, i + 1) * voxel_nm``, as in the volume). A label's surface therefore lies
on its voxels' faces in nm: bbox exact.

Seams. A supercuboid's block reaches one voxel into its high-side neighbours; meshed with
``close=False``, its surface ends on the plane of that voxel's samples, where the neighbour's
begins, and both compute the same vertices there (the same samples; exact half-integers). On a
side where the level's extent ends, the block is padded with one zero sample, which closes the
surface there (a cap on the extent's face). So the union of the fragments is watertight.

Octree (one per supercuboid, self-contained so a supercuboid's rebuild reads no other). The
coarsest level of detail's node IS the supercuboid; each finer level halves it per axis, down
to nodes >= 2 voxels deep (``octree``): 3 levels for every supercuboid shape NDStore has
(512x512x8 .. 256^3). The grid origin is one supercuboid below voxel 0 (``-cell``): the cap on
an extent's low face, at -1/2 voxel, falls in the node below, whose position must stay >= 0.
Level L is meshed from the block sampled every ``2^L`` voxels (fewer along a coarse axis:
``strides``), on samples aligned to the global grid, so seams meet at every level and no triangle
crosses a child node's boundary (those are sample planes), as the format requires of L > 0.
Measured cheaper than simplifying (docs/design/meshes.md, "Measurements").

Quantization. 10 bits per axis within the node (1/8 voxel in a 128-voxel node), written as
integers through Draco's own quantizer with range 2^10 - 1 and origin 0 (so the values Draco
stores are those integers, which Neuroglancer reads with its dequantization skipped and
CloudVolume dequantizes to the same). A vertex on a node face is 0 or 1023 there, so both sides
of a seam decode it alike. 10 bits encode 1.7x faster than 16 (Draco is most of the time).

Fragment object (``_ndstore-seg&mesh&<supercuboid>``, safe to read: no pickle):
``MAGIC | u32le n | n bytes of JSON header | table | data``; the header holds the format
version, ``cell``, ``num_lods`` and the table's row count; the table is ``PIECE`` rows
(label, lod, x, y, z node position, offset into data, size) sorted by label, lod, Z-order, so
``label_pieces`` finds a label's rows by binary search and slices its bytes without decoding
anything else.
"""

from __future__ import annotations

import itertools
import json
import math
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import DracoPy
import numpy as np
import zmesh

from ndstore.core import morton
from ndstore.core.errors import DataCorrupt
from ndstore.core.geometry import XYZ, Box
from ndstore.core.segments.bounds import MeshBounds, check_mesh_bounds
from ndstore.core.segments.shards import minishard_index

MAGIC = b"NDMESH1\n"
FORMAT_VERSION = 1
QUANTIZATION_BITS = 10
QMAX = (1 << QUANTIZATION_BITS) - 1
MAX_SPLITS = 2  # level 0's nodes: the supercuboid halved at most twice per axis
MIN_NODE_VOXELS = 2  # ... and at least 2 voxels deep
# Measured on a dense supercuboid's fragments: levels 1..7 encode in the same time (+-5%), 6 in 43%
# fewer bytes than 1; 0 (no edgebreaker) takes half the time for 8x the bytes.
DRACO_COMPRESSION_LEVEL = 6
PIECE = np.dtype([("label", "<u8"), ("lod", "<u4"), ("x", "<u4"), ("y", "<u4"), ("z", "<u4"),
                  ("offset", "<u8"), ("size", "<u4")])
_HEADER_LIMIT = 1 << 16
DEFAULT_BOUNDS = MeshBounds()

# Sharded: identity hash, no preshift, one minishard per shard; shard = the label's low 16 bits,
# so consecutive labels spread over 65,536 shards and a shard holds few segments.
SHARD_BITS = 16
MINISHARD_BITS = 0


# -- the octree of a supercuboid ------------------------------------------------------------------
@dataclass(frozen=True)
class Octree:
    cell: XYZ  # the supercuboid, voxels (x, y, z)
    num_lods: int

    @property
    def chunk(self) -> XYZ:
        """Level 0's node shape, voxels."""
        return tuple(c >> (self.num_lods - 1) for c in self.cell)  # type: ignore[return-value]

    @property
    def grid_origin(self) -> XYZ:
        return tuple(-c for c in self.cell)  # type: ignore[return-value]

    def node_size(self, lod: int) -> np.ndarray:
        return np.array(self.chunk, np.float64) * (1 << lod)

    def node_of(self, point: XYZ, lod: int) -> XYZ:
        return tuple((p - o) // (c << lod) for p, o, c in zip(point, self.grid_origin, self.chunk))  # type: ignore


def octree(cell: XYZ) -> Octree:
    """The levels of detail of a supercuboid of shape ``cell``: level 0's nodes are the
    supercuboid halved per axis up to MAX_SPLITS times, while every axis stays whole and at
    least MIN_NODE_VOXELS deep."""
    splits = 0
    while splits < MAX_SPLITS and all(c % (2 << splits) == 0 and c >> (splits + 1) >= MIN_NODE_VOXELS for c in cell):
        splits += 1
    return Octree(cell, splits + 1)


def strides(tree: Octree, lod: int, voxel_nm: tuple[float, float, float]) -> XYZ:
    """Level ``lod``'s sampling step per axis: 2^lod, less along an axis whose voxels are
    coarser (an anisotropic z keeps its samples), and dividing the child nodes' size so their
    boundaries are sample planes."""
    finest = min(voxel_nm)
    out = []
    for c, nm in zip(tree.chunk, voxel_nm):
        step = max(1, (1 << lod) >> max(0, int(math.floor(math.log2(nm / finest)))))
        while lod and (c << (lod - 1)) % step:
            step //= 2
        out.append(step)
    return tuple(out)  # type: ignore[return-value]


# -- building a supercuboid's fragment object ----------------------------------------------------
def mesh_fragment(block: np.ndarray, box: Box, cell: XYZ, voxel_nm: tuple[float, float, float],
                  bounds: MeshBounds = DEFAULT_BOUNDS, extent: Box | None = None) -> bytes | None:
    """The fragment object of the supercuboid ``box`` (level-0 voxels, clipped to the extent),
    from ``block``: its labels, (z, y, x), reaching one voxel past ``box.hi`` on each axis where
    the extent continues. None when it holds no label. Skipped (before any meshing) past
    ``bounds``. ``extent`` tells which low faces are the extent's; without it, a low face is
    the extent's where the box does not start on the supercuboid grid, or starts at 0."""
    low_edge, high_edge = _edges(block, box, cell, extent)
    labels = check_mesh_bounds(block, bounds)
    if not len(labels):
        return None
    tree = octree(cell)
    rows: list[tuple[int, int, int, int, int, int, int]] = []
    data: list[bytes] = []
    at = 0
    for lod in range(tree.num_lods):
        for label, position, encoded in _lod_fragments(block, box, tree, lod, voxel_nm, low_edge, high_edge):
            rows.append((label, lod, *position, at, len(encoded)))
            data.append(encoded)
            at += len(encoded)
    if not rows:
        return None
    return _pack(tree, rows, data)


def _edges(block: np.ndarray, box: Box, cell: XYZ, extent: Box | None) -> tuple[list[bool], list[bool]]:
    shape = box.shape_zyx[::-1]
    got = block.shape[::-1]
    if block.ndim != 3 or any(g not in (s, s + 1) for g, s in zip(got, shape)):
        raise ValueError(f"block of shape {block.shape} (z, y, x) for box {box}: it covers the box and one voxel "
                         "past its high side where the extent continues")
    high = [g == s for g, s in zip(got, shape)]
    if extent is not None:
        low = [b == e for b, e in zip(box.lo, extent.lo)]
    else:
        low = [b == 0 or b % c != 0 for b, c in zip(box.lo, cell)]
    return low, high


def _sampled(block: np.ndarray, box: Box, step: XYZ, low_edge: list[bool],
             high_edge: list[bool]) -> tuple[np.ndarray, np.ndarray] | None:
    """The block's samples on the global grid of ``step`` (x, y, z), padded with a zero sample
    on the extent's faces, and the level-0 voxel of its first sample; None if an axis has none."""
    slices, origin, pads = [], [], []
    for axis in (2, 1, 0):  # z, y, x: the array's axes
        s, lo, n = step[axis], box.lo[axis], block.shape[2 - axis]
        first = (-lo) % s
        if first >= n:
            return None
        slices.append(slice(first, None, s))
        pads.append((int(low_edge[axis]), int(high_edge[axis])))
        origin.append(lo + first - (s if low_edge[axis] else 0))
    sampled = block[tuple(slices)]
    if any(a or b for a, b in pads):
        sampled = np.pad(sampled, pads)
    return sampled, np.array(origin[::-1], np.float64)


def _lod_fragments(block: np.ndarray, box: Box, tree: Octree, lod: int, voxel_nm: tuple[float, float, float],
                   low_edge: list[bool], high_edge: list[bool]) -> Iterator[tuple[int, XYZ, bytes]]:
    """(label, node position, Draco bytes) of every node of level ``lod``. Each node is meshed
    from its own samples (its faces are sample planes, shared with its neighbours, so their
    surfaces meet there as the supercuboids' do); no mesh is cut."""
    step = strides(tree, lod, voxel_nm)
    sampled = _sampled(block, box, step, low_edge, high_edge)
    if sampled is None:
        return
    samples, origin = sampled
    size = tree.node_size(lod)
    grid = np.array(tree.grid_origin, np.float64)
    runs = [_node_runs(samples.shape[2 - axis], origin[axis], step[axis], grid[axis], size[axis]) for axis in range(3)]
    mesher = zmesh.Mesher(step)
    for (x0, x1, nx), (y0, y1, ny), (z0, z1, nz) in itertools.product(*runs):
        piece = samples[z0:z1 + 1, y0:y1 + 1, x0:x1 + 1]
        if not piece.any():
            continue
        mesher.mesh(piece.T, close=False)  # x, y, z: vertices come in x, y, z, in voxels from the piece's corner
        node = np.array((nx, ny, nz))
        shift = origin + np.array((x0, y0, z0)) * step - (grid + node * size)
        for label in mesher.ids():
            if label == 0:
                continue
            mesh = mesher.get(label, normals=False, reduction_factor=0)
            if len(mesh.faces):
                q = np.clip(np.rint((mesh.vertices + shift) * (QMAX / size)), 0, QMAX).astype(np.float32)
                yield int(label), (nx, ny, nz), DracoPy.encode(
                    q, mesh.faces, quantization_bits=QUANTIZATION_BITS, compression_level=DRACO_COMPRESSION_LEVEL,
                    quantization_range=QMAX, quantization_origin=[0.0, 0.0, 0.0])
        mesher.clear()


def _node_runs(n: int, origin: float, step: int, grid: float, size: float) -> list[tuple[int, int, int]]:
    """Along one axis of ``n`` samples: (first sample, last sample, node) of each node's run of
    cube layers. A layer (samples i, i + 1) is in the node of sample i: a zero sample padded
    below the extent's low face falls in the node below, one above its high face in the node
    of the last sample; the overlap sample is only ever a run's last."""
    if n < 2:
        return []
    nodes = np.floor((origin + np.arange(n - 1) * step - grid) / size).astype(np.int64)
    cuts = [0, *(np.flatnonzero(np.diff(nodes)) + 1).tolist(), n - 1]
    return [(a, b, int(nodes[a])) for a, b in zip(cuts[:-1], cuts[1:])]


def _pack(tree: Octree, rows: list[tuple[int, int, int, int, int, int, int]], data: list[bytes]) -> bytes:
    table = np.array(rows, PIECE)
    codes = morton.encode(table["x"], table["y"], table["z"])
    order = np.lexsort((codes, table["lod"], table["label"]))
    header = json.dumps({"format": "ndstore-mesh-fragments", "version": FORMAT_VERSION, "cell": list(tree.cell),
                         "num_lods": tree.num_lods, "pieces": len(rows)}).encode()
    return b"".join([MAGIC, struct.pack("<I", len(header)), header, table[order].tobytes(), *data])


# -- reading fragment objects -----------------------------------------------------------------------
@dataclass(frozen=True)
class Pieces:
    """One label's fragments in one supercuboid's object."""

    tree: Octree
    rows: np.ndarray  # PIECE
    data: memoryview  # the object's data section; rows' offsets index it

    def fragment(self, i: int) -> bytes:
        row = self.rows[i]
        return bytes(self.data[int(row["offset"]):int(row["offset"]) + int(row["size"])])


def _unpack(blob: bytes) -> tuple[Octree, np.ndarray, memoryview]:
    view = memoryview(blob)
    if bytes(view[:len(MAGIC)]) != MAGIC or len(view) < len(MAGIC) + 4:
        raise DataCorrupt("not a mesh fragment object")
    (n,) = struct.unpack_from("<I", view, len(MAGIC))
    start = len(MAGIC) + 4
    if n > _HEADER_LIMIT or start + n > len(view):
        raise DataCorrupt("mesh fragment object: bad header length")
    try:
        header: dict[str, Any] = json.loads(bytes(view[start:start + n]))
        count, cell, lods = int(header["pieces"]), tuple(int(c) for c in header["cell"]), int(header["num_lods"])
    except (ValueError, KeyError, TypeError) as exc:
        raise DataCorrupt(f"mesh fragment object: bad header ({exc})") from None
    if header.get("version") != FORMAT_VERSION or len(cell) != 3 or not all(0 < c <= morton.MAX_COORD for c in cell) \
            or octree(cell).num_lods != lods:
        raise DataCorrupt("mesh fragment object: unknown version or shape")
    table_end = start + n + count * PIECE.itemsize
    if count < 0 or table_end > len(view):
        raise DataCorrupt("mesh fragment object: truncated table")
    rows = np.frombuffer(view[start + n:table_end], PIECE)
    data = view[table_end:]
    if count and int((rows["offset"] + rows["size"]).max()) > len(data):
        raise DataCorrupt("mesh fragment object: a piece lies past its end")
    return Octree(cell, lods), rows, data


def label_pieces(blob: bytes, label: int) -> Pieces:
    """``label``'s fragments in a fragment object (possibly none), found by binary search."""
    tree, rows, data = _unpack(blob)
    key = np.uint64(label)
    lo, hi = np.searchsorted(rows["label"], key, "left"), np.searchsorted(rows["label"], key, "right")
    return Pieces(tree, rows[lo:hi], data)


def fragment_labels(blob: bytes) -> np.ndarray:
    """The labels a fragment object holds pieces of, sorted."""
    return np.unique(_unpack(blob)[1]["label"])


# -- Neuroglancer's files -----------------------------------------------------------------------------
def mesh_info(voxel_nm: tuple[float, float, float], sharded: bool) -> dict[str, Any]:
    """The mesh directory's ``info``: stored model (voxel index) -> nm, voxel centres at +1/2."""
    rx, ry, rz = (float(v) for v in voxel_nm)
    info: dict[str, Any] = {"@type": "neuroglancer_multilod_draco", "vertex_quantization_bits": QUANTIZATION_BITS,
                            "transform": [rx, 0.0, 0.0, rx / 2, 0.0, ry, 0.0, ry / 2, 0.0, 0.0, rz, rz / 2],
                            "lod_scale_multiplier": 1.0}
    if sharded:
        info["sharding"] = {"@type": "neuroglancer_uint64_sharded_v1", "preshift_bits": 0, "hash": "identity",
                            "minishard_bits": MINISHARD_BITS, "shard_bits": SHARD_BITS,
                            "minishard_index_encoding": "raw", "data_encoding": "raw"}
    return info


def segment_manifest(pieces: Sequence[Pieces]) -> tuple[bytes, bytes] | None:
    """A segment's manifest (``{id}.index``) and fragment data (``{id}``) from its pieces in
    several supercuboids' objects; None when it has none. Each level lists its nodes in Z-order,
    with an empty fragment for a parent that holds no triangle of its own (a coarse level can
    lose a thin part), so every node hangs from the top of the octree."""
    found = [p for p in pieces if len(p.rows)]
    if not found:
        return None
    tree = found[0].tree
    if any(p.tree != tree for p in found):
        raise DataCorrupt("mesh fragment objects of one channel disagree on their octree")
    by_node: dict[tuple[int, int, int, int], bytes] = {}
    for p in found:
        for i, row in enumerate(p.rows):
            # one supercuboid owns each node; keep the first should a stale object repeat one
            by_node.setdefault((int(row["lod"]), int(row["x"]), int(row["y"]), int(row["z"])), p.fragment(i))
    levels: list[set[XYZ]] = [set() for _ in range(tree.num_lods)]
    for lod, x, y, z in by_node:
        levels[lod].add((x, y, z))
    for lod in range(1, tree.num_lods):
        levels[lod].update((x >> 1, y >> 1, z >> 1) for x, y, z in levels[lod - 1])
    head = [np.array(tree.chunk, "<f4").tobytes(), np.array(tree.grid_origin, "<f4").tobytes(),
            struct.pack("<I", tree.num_lods), np.array([1 << lod for lod in range(tree.num_lods)], "<f4").tobytes(),
            np.zeros(3 * tree.num_lods, "<f4").tobytes(), np.array([len(s) for s in levels], "<u4").tobytes()]
    data = []
    for lod, nodes in enumerate(levels):
        positions = np.array(sorted(nodes), np.uint32).reshape(-1, 3)
        order = np.argsort(morton.encode(positions[:, 0], positions[:, 1], positions[:, 2]), kind="stable")
        positions = positions[order]
        frags = [by_node.get((lod, int(x), int(y), int(z)), b"") for x, y, z in positions]
        head.append(positions.T.astype("<u4").tobytes())
        head.append(np.array([len(f) for f in frags], "<u4").tobytes())
        data.extend(frags)
    return b"".join(head), b"".join(data)


def shard_of(label: int) -> int:
    """The shard (``{shard:04x}.shard``) that holds ``label``'s mesh."""
    return (label >> MINISHARD_BITS) & ((1 << SHARD_BITS) - 1)


def shard_name(shard: int) -> str:
    return f"{shard:0{-(-SHARD_BITS // 4)}x}.shard"


def shard_file(segments: Sequence[tuple[int, bytes, bytes]]) -> bytes:
    """A shard of (label, manifest, fragment data): one minishard, each segment's fragment data
    immediately before its manifest, the minishard index pointing at the manifests."""
    ordered = sorted(segments, key=lambda s: s[0])
    index_bytes = 24 * len(ordered)
    starts, at = [], index_bytes
    for _, manifest, data in ordered:
        starts.append(at + len(data))
        at += len(data) + len(manifest)
    minishard = minishard_index([s[0] for s in ordered], starts, [len(s[1]) for s in ordered])
    body = [struct.pack("<QQ", 0, len(minishard)), minishard]
    for _, manifest, data in ordered:
        body += [data, manifest]
    return b"".join(body)
