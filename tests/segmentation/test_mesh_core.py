"""Meshes of one supercuboid and the Neuroglancer files built from them (ndstore.core.segments.mesh),
pure: fragments built supercuboid by supercuboid meet across the seams without cracks, as
CloudVolume 12.15.2's own decoder reads them; bounds refuse a pathological block at once."""

from __future__ import annotations

import itertools
import json
import time

import numpy as np
import pytest
import trimesh

from ndstore.core.geometry import Box
from ndstore.core.segments import mesh
from ndstore.core.segments.bounds import MeshBounds, Skipped

TOP, HIGH = 2**64 - 1, 2**63
VOXEL = (4.0, 4.0, 40.0)


def ellipsoid(shape_zyx: tuple[int, int, int], centre_xyz: tuple[float, ...], radii_nm: tuple[float, ...],
              voxel: tuple[float, float, float] = VOXEL) -> np.ndarray:
    z, y, x = np.indices(shape_zyx)
    return sum(((v - c) * r / rad) ** 2 for v, c, r, rad in zip((x, y, z), centre_xyz, voxel, radii_nm)) < 1


def build(labels: np.ndarray, cell: tuple[int, int, int], extent: Box | None = None,
          voxel: tuple[float, float, float] = VOXEL, **kw: object) -> dict[tuple[int, int, int], bytes]:
    """Every supercuboid's fragment object, each from its box plus one voxel on the high sides
    where the extent continues (what the rebuild reads)."""
    extent = extent or Box((0, 0, 0), labels.shape[::-1])  # type: ignore[arg-type]
    out = {}
    ranges = [range(lo // c, -(-hi // c)) for lo, hi, c in zip(extent.lo, extent.hi, cell)]
    for index in itertools.product(*ranges):
        box = Box(tuple(i * c for i, c in zip(index, cell)), tuple((i + 1) * c for i, c in zip(index, cell))
                  ).intersect(extent)  # type: ignore[arg-type]
        assert box is not None
        grown = Box(box.lo, tuple(min(h + 1, e) for h, e in zip(box.hi, extent.hi)))  # type: ignore[arg-type]
        blob = mesh.mesh_fragment(labels[grown.slices_zyx(extent.lo)], box, cell, voxel, **kw)  # type: ignore[arg-type]
        if blob is not None:
            out[index] = blob
    return out


def decoded(objects: dict[tuple[int, int, int], bytes], label: int, lod: int = 0,
            voxel: tuple[float, float, float] = VOXEL) -> trimesh.Trimesh:
    """The label's mesh at ``lod`` as CloudVolume decodes the manifest and fragment data."""
    from cloudvolume.datasource.precomputed.mesh.multilod import (
        MultiLevelPrecomputedMeshManifest,
        extract_lod_meshes,
    )

    built = mesh.segment_manifest([mesh.label_pieces(blob, label) for blob in objects.values()])
    assert built is not None
    manifest_bytes, data = built
    manifest = MultiLevelPrecomputedMeshManifest.from_binary(manifest_bytes, segment_id=label)
    sizes = [int(np.sum(s)) for s in manifest.fragment_offsets]
    start = sum(sizes[:lod])
    info = mesh.mesh_info(voxel, sharded=False)
    transform = np.array(info["transform"] + [0, 0, 0, 1]).reshape(4, 4)
    meshes = extract_lod_meshes(manifest, lod, data[start:start + sizes[lod]], info["vertex_quantization_bits"],
                                transform)[label]
    vertices = np.concatenate([m.vertices for m in meshes])
    faces, at = [], 0
    for m in meshes:
        faces.append(m.faces + at)
        at += len(m.vertices)
    out = trimesh.Trimesh(vertices, np.concatenate(faces), process=False)
    out.merge_vertices()
    return out


def voxel_bounds(labels: np.ndarray, label: int, voxel: tuple[float, float, float] = VOXEL,
                 origin: tuple[int, int, int] = (0, 0, 0)) -> np.ndarray:
    z, y, x = np.nonzero(labels == label)
    lo = np.array([x.min(), y.min(), z.min()]) + origin
    hi = np.array([x.max(), y.max(), z.max()]) + 1 + np.array(origin)
    return np.array([lo, hi]) * np.array(voxel)


def check_closed(got: trimesh.Trimesh, labels: np.ndarray, label: int, voxel: tuple[float, float, float] = VOXEL,
                 origin: tuple[int, int, int] = (0, 0, 0)) -> None:
    assert got.is_watertight, f"label {label}: open"
    want = voxel_bounds(labels, label, voxel, origin)
    assert np.all(np.abs(got.bounds - want) <= np.array(voxel)), (got.bounds, want)
    volume = np.count_nonzero(labels == label) * np.prod(voxel)
    assert abs(got.volume - volume) <= 0.1 * volume, (got.volume, volume)


def test_two_touching_blobs_across_every_seam_are_closed() -> None:
    shape = (16, 64, 64)  # z y x: 2 x 2 x 2 supercuboids of 32 x 32 x 8
    labels = np.zeros(shape, np.uint64)
    labels[ellipsoid(shape, (30, 33, 7.5), (90, 80, 220))] = TOP
    labels[ellipsoid(shape, (48, 30, 8), (60, 70, 200)) & (labels == 0)] = HIGH
    objects = build(labels, (32, 32, 8))
    assert len(objects) == 8
    for label in (TOP, HIGH):
        check_closed(decoded(objects, label), labels, label)


def test_a_blob_on_the_extent_faces_is_capped_there() -> None:
    """Touching the extent's low faces (at 0 and away from the grid) and its high faces."""
    for lo in ((0, 0, 0), (5, 3, 2)):
        extent = Box(lo, (lo[0] + 50, lo[1] + 40, lo[2] + 12))
        shape = extent.shape_zyx
        labels = np.zeros(shape, np.uint64)
        labels[ellipsoid(shape, (0, 0, 0), (120, 100, 300))] = 7
        labels[ellipsoid(shape, (49, 39, 11), (80, 90, 250))] = 9
        objects = build(labels, (32, 32, 8), extent=extent)
        for label in (7, 9):
            check_closed(decoded(objects, label), labels, label, origin=lo)


def test_isotropic_supercuboids_and_lower_levels_of_detail() -> None:
    shape = (40, 40, 40)
    labels = np.zeros(shape, np.uint64)
    labels[ellipsoid(shape, (19, 20, 21), (60, 50, 70), (4.0, 4.0, 4.0))] = 3
    objects = build(labels, (16, 16, 16), voxel=(4.0, 4.0, 4.0))
    check_closed(decoded(objects, 3, voxel=(4.0, 4.0, 4.0)), labels, 3, voxel=(4.0, 4.0, 4.0))
    tree = mesh.octree((16, 16, 16))
    assert tree.num_lods == 3 and tree.chunk == (4, 4, 4)
    for lod in (1, 2):  # coarser, on the same seams: still closed, within a coarse sample of the voxels
        got = decoded(objects, 3, lod, voxel=(4.0, 4.0, 4.0))
        assert got.is_watertight
        want = voxel_bounds(labels, 3, (4.0, 4.0, 4.0))
        assert np.all(np.abs(got.bounds - want) <= 4.0 * (1 << lod))


def test_octree_of_every_supercuboid_shape() -> None:
    for cell, chunk in (((512, 512, 8), (128, 128, 2)), ((512, 512, 16), (128, 128, 4)),
                        ((512, 512, 64), (128, 128, 16)), ((128, 128, 128), (32, 32, 32)), ((8, 8, 2), (8, 8, 2))):
        tree = mesh.octree(cell)  # type: ignore[arg-type]
        assert tree.chunk == chunk and tree.chunk[0] << (tree.num_lods - 1) == cell[0]


def test_label_zero_is_background_and_an_empty_block_stores_nothing() -> None:
    block = np.zeros((9, 33, 33), np.uint64)
    box = Box((0, 0, 0), (32, 32, 8))
    assert mesh.mesh_fragment(block, box, (32, 32, 8), VOXEL) is None
    block[2:5, 3:9, 4:10] = 12
    blob = mesh.mesh_fragment(block, box, (32, 32, 8), VOXEL)
    assert blob is not None
    assert mesh.fragment_labels(blob).tolist() == [12]
    assert len(mesh.label_pieces(blob, 0).rows) == 0
    assert mesh.segment_manifest([mesh.label_pieces(blob, 5)]) is None


def test_the_block_must_cover_the_box() -> None:
    with pytest.raises(ValueError, match="one voxel past"):
        mesh.mesh_fragment(np.zeros((8, 30, 30), np.uint32), Box((0, 0, 0), (32, 32, 8)), (32, 32, 8), VOXEL)


def test_a_checkerboard_is_refused_in_well_under_a_second() -> None:
    z, y, x = np.indices((8, 512, 512), dtype=np.uint64)
    board = (x + 512 * y + 512 * 512 * z + 1).astype(np.uint64)  # a million one-voxel labels
    box = Box((0, 0, 0), (512, 512, 8))
    start = time.perf_counter()
    with pytest.raises(Skipped, match="faces between differing voxels"):
        mesh.mesh_fragment(board, box, (512, 512, 8), VOXEL)
    assert time.perf_counter() - start < 0.5
    few = np.where((x // 2 + y // 2) % 2 == 0, x // 2 + 1, 0).astype(np.uint64)[:3]  # many labels, small surface
    with pytest.raises(Skipped, match="labels"):
        mesh.mesh_fragment(few[:, :64, :64], Box((0, 0, 0), (64, 64, 3)), (64, 64, 8), VOXEL,
                           MeshBounds(max_labels=10))


def test_hostile_fragment_objects_are_refused() -> None:
    from ndstore.core.errors import DataCorrupt

    block = np.zeros((8, 32, 32), np.uint8)
    block[1:4, 1:9, 1:9] = 1
    blob = mesh.mesh_fragment(block, Box((0, 0, 0), (32, 32, 8)), (32, 32, 8), VOXEL)
    assert blob is not None
    head = len(mesh.MAGIC) + 4
    n = int.from_bytes(blob[len(mesh.MAGIC):head], "little")
    header = json.loads(blob[head:head + n])
    for bad in (b"", b"pickle" + blob, blob[:head + n + 10], blob[:len(mesh.MAGIC)] + b"\xff\xff\xff\xff",
                blob[:head] + json.dumps({**header, "pieces": 10**9}).encode().ljust(n) + blob[head + n:]):
        with pytest.raises(DataCorrupt):
            mesh.label_pieces(bad, 1)


def test_shard_file_holds_each_segments_data_before_its_manifest() -> None:
    from cloudvolume.datasource.precomputed.sharding import ShardingSpecification

    spec = ShardingSpecification.from_dict(mesh.mesh_info(VOXEL, sharded=True)["sharding"])
    for label in (1, 70000, HIGH, TOP):
        assert spec.compute_shard_location(label).shard_number == mesh.shard_name(mesh.shard_of(label))[:-6]
    segments = [(5, b"M5", b"data-of-5"), (3, b"manifest3", b"d3"), (5 + 65536, b"M", b"")]
    shard = mesh.shard_file(segments)
    start, end = np.frombuffer(shard[:16], "<u8")
    ids, offsets, sizes = np.frombuffer(shard[16 + start:16 + end], "<u8").reshape(3, -1)
    assert np.cumsum(ids).tolist() == [3, 5, 5 + 65536]
    at = 16
    for (_, manifest, data), delta, size in zip(sorted(segments), offsets, sizes):
        at += int(delta)
        assert shard[at:at + size] == manifest and shard[at - len(data):at] == data
        at += int(size)


def test_coarse_fragments_split_along_their_children_as_neuroglancer_partitions_them() -> None:
    """Neuroglancer cuts a level > 0 fragment into its 8 children by the quantized position
    (2^(bits - 1): on both sides); no triangle may straddle that plane."""
    import DracoPy

    shape = (16, 64, 64)
    labels = np.zeros(shape, np.uint64)
    labels[ellipsoid(shape, (30, 33, 7.5), (90, 80, 220))] = TOP
    point = (1 << mesh.QUANTIZATION_BITS) // 2
    checked = 0
    for blob in build(labels, (32, 32, 8)).values():
        pieces = mesh.label_pieces(blob, TOP)
        for i, row in enumerate(pieces.rows):
            if row["lod"] == 0:
                continue
            decoded = DracoPy.decode(pieces.fragment(i))
            corners = np.asarray(decoded.points)[np.asarray(decoded.faces)]  # (faces, 3, xyz)
            low, high = (corners <= point).all(axis=1), (corners >= point).all(axis=1)
            assert (low | high).all()
            checked += len(corners)
    assert checked > 100
