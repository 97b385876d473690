"""Skeletons of label blocks, pure (ndstore.core.segments.skeleton): per-supercuboid fragments
that merge across seams into one connected skeleton with radii, uint64 labels up to 2^64-1,
background ignored, bounds checked before kimimaro runs, fragment objects that refuse to be
misread, and shard files that CloudVolume's own shard reader reads."""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest
from osteoid import Skeleton

from ndstore.core.errors import DataCorrupt
from ndstore.core.geometry import Box
from ndstore.core.segments import skeleton as sk
from ndstore.core.segments.bounds import Skipped
from ndstore.core.segments.shards import ShardSpec, shard_file

NM = (4.0, 4.0, 40.0)
TOP = 2**64 - 1
HIGH = 2**63 + 5


def tube_volume(shape_zyx: tuple[int, int, int] = (16, 96, 256)) -> np.ndarray:
    """A slanted tube (label TOP) along x, a straight thin one (HIGH) and a blob (7)."""
    z, y, x = np.ogrid[:shape_zyx[0], :shape_zyx[1], :shape_zyx[2]]
    vol = np.zeros(shape_zyx, np.uint64)
    vol[((y - (30 + 0.15 * x)) ** 2 + ((z - 8) * 10) ** 2) < 14 ** 2] = TOP
    vol[((y - 85) ** 2 + ((z - 8) * 10) ** 2 + 0 * x) < 7 ** 2] = HIGH
    vol[((y - 15) ** 2 + (x - 200) ** 2 + ((z - 8) * 4) ** 2) < 12 ** 2] = 7
    return vol


def fragments(vol: np.ndarray, cuts: list[int], nm: tuple[float, float, float] = NM) -> list[bytes | None]:
    """Each supercuboid [cuts[i], cuts[i+1]) in x skeletonized as the rebuild does: its block
    reaching one voxel into the next where there is one."""
    out = []
    width = vol.shape[2]
    for lo, hi in zip(cuts, cuts[1:]):
        block = vol[:, :, lo:min(hi + 1, width)]
        box = Box((lo, 0, 0), (hi, vol.shape[1], vol.shape[0]))
        out.append(sk.skeleton_fragment(block, box, (hi - lo, vol.shape[1], vol.shape[0]), nm))
    return out


def merged(blobs: list[bytes | None], label: int) -> Skeleton:
    body = sk.skeleton_of([b for b in blobs if b is not None], label)
    assert body is not None
    return Skeleton.from_precomputed(body, vertex_attributes=[sk.RADIUS])


def voxel_bbox_nm(vol: np.ndarray, label: int, nm: tuple[float, float, float] = NM) -> tuple[np.ndarray, np.ndarray]:
    z, y, x = np.nonzero(vol == label)
    lo = np.array([x.min(), y.min(), z.min()]) * nm
    hi = np.array([x.max(), y.max(), z.max()]) * nm
    return lo, hi


def test_a_tube_across_a_seam_merges_into_one_connected_skeleton_with_radii() -> None:
    vol = tube_volume()
    blobs = fragments(vol, [0, 128, 256])
    assert all(b is not None for b in blobs)
    for label in (TOP, HIGH):
        pieces = [sk.piece_of(b, label) for b in blobs if b is not None]
        assert all(p is not None and len(p.vertices) for p in pieces)  # a piece on each side of the seam
        skel = merged(blobs, label)
        assert len(skel.components()) == 1, label
        lo, hi = voxel_bbox_nm(vol, label)
        # spans the label along x from one end to the other (within a few voxels), inside its box
        assert skel.vertices[:, 0].min() <= lo[0] + 3 * NM[0] and skel.vertices[:, 0].max() >= hi[0] - 3 * NM[0]
        assert (skel.vertices >= lo - 1e-3).all() and (skel.vertices <= hi + 1e-3).all()
        assert skel.radius.shape == (len(skel.vertices),) and (skel.radius > 0).all()
    # the thick tube is ~14 voxels (56 nm) in radius in xy, 1.4 slices (56 nm) in z
    assert 20 < float(np.median(merged(blobs, TOP).radius)) < 80


def test_the_seam_welds_without_help() -> None:
    """The pieces share their vertices on the overlap plane: concatenated and consolidated
    (no joining of close components), they are already one component."""
    vol = tube_volume()
    blobs = fragments(vol, [0, 100, 180, 256])
    pieces = [p for b in blobs if b is not None and (p := sk.piece_of(b, TOP)) is not None]
    assert len(pieces) == 3
    parts = [Skeleton(np.array(p.vertices), np.array(p.edges), radii=np.array(p.radius), space="physical")
             for p in pieces]
    assert len(Skeleton.simple_merge(parts).consolidate().components()) == 1


def test_vertices_are_nanometres_of_the_volume() -> None:
    """A block placed at box.lo gives the same skeleton shifted by box.lo * voxel_nm."""
    vol = tube_volume((8, 64, 64))
    here = sk.skeleton_fragment(vol, Box((0, 0, 0), (64, 64, 8)), (64, 64, 8), NM)
    there = sk.skeleton_fragment(vol, Box((640, 128, 16), (704, 192, 24)), (64, 64, 8), NM)
    assert here is not None and there is not None
    a, b = sk.piece_of(here, TOP), sk.piece_of(there, TOP)
    assert a is not None and b is not None
    np.testing.assert_allclose(b.vertices - a.vertices, np.broadcast_to([640 * 4, 128 * 4, 16 * 40], a.vertices.shape))
    np.testing.assert_array_equal(a.edges, b.edges)


def test_background_and_uint64_labels() -> None:
    vol = tube_volume()
    blob = sk.skeleton_fragment(vol, Box((0, 0, 0), vol.shape[::-1]), vol.shape[::-1], NM)
    assert blob is not None
    assert sk.fragment_labels(blob).tolist() == [7, HIGH, TOP]  # ascending, 0 never
    assert sk.piece_of(blob, 0) is None and sk.piece_of(blob, 8) is None
    assert sk.skeleton_of([blob], 0) is None
    assert sk.skeleton_fragment(np.zeros((4, 16, 16), np.uint64), Box((0, 0, 0), (16, 16, 4)), (16, 16, 4), NM) is None


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "uint64"])
def test_every_label_dtype(dtype: str) -> None:
    vol = (tube_volume((8, 64, 96)) != 0).astype(dtype) * 3
    blob = sk.skeleton_fragment(vol, Box((0, 0, 0), (96, 64, 8)), (96, 64, 8), NM)
    assert blob is not None and sk.fragment_labels(blob).tolist() == [3]


def test_a_checkerboard_of_one_voxel_labels_is_dust_and_costs_one_pass() -> None:
    shape = (8, 512, 512)
    board = (np.indices(shape).sum(axis=0) % 2).astype(np.uint64) * (np.arange(np.prod(shape), dtype=np.uint64)
                                                                    .reshape(shape) + 1)
    start = time.perf_counter()
    assert sk.skeleton_fragment(board, Box((0, 0, 0), (512, 512, 8)), (512, 512, 8), NM) is None
    assert time.perf_counter() - start < 1.0  # ~20-40 ms: no kimimaro call


def test_bounds_refuse_before_kimimaro() -> None:
    many = np.repeat(np.arange(1, 3001, dtype=np.uint32), 1100).reshape(1, 3000, 1100)  # 3000 labels over dust
    start = time.perf_counter()
    with pytest.raises(Skipped, match="3000 labels"):
        sk.skeleton_fragment(many, Box((0, 0, 0), (1100, 3000, 1)), (1100, 3000, 1), NM)
    with pytest.raises(Skipped, match="voxels of labels"):
        sk.skeleton_fragment(many, Box((0, 0, 0), (1100, 3000, 1)), (1100, 3000, 1), NM,
                             sk.SkeletonBounds(max_labels=10_000, max_voxels=1_000_000))
    with pytest.raises(Skipped, match="block of"):
        sk.skeleton_fragment(many, Box((0, 0, 0), (1100, 3000, 1)), (1100, 3000, 1), NM,
                             sk.SkeletonBounds(max_block_voxels=1_000_000))
    assert time.perf_counter() - start < 2.0


def test_a_fragment_object_round_trips_and_refuses_damage() -> None:
    rng = np.random.default_rng(0)
    pieces = {label: sk.SkeletonPiece(rng.random((n, 3), np.float32), np.array([[i, i + 1] for i in range(n - 1)],
                                                                              np.uint32).reshape(-1, 2),
                                      rng.random(n, np.float32))
              for label, n in ((TOP, 5), (1, 1), (HIGH, 3))}
    blob = sk.encode_fragment(pieces)
    assert sk.fragment_labels(blob).tolist() == [1, HIGH, TOP]
    for label, piece in pieces.items():
        got = sk.piece_of(blob, label)
        assert got is not None
        for a, b in zip(got, piece):
            np.testing.assert_array_equal(a, b)
    size = struct.unpack_from("<I", blob)[0]
    damaged = [blob[:-1], blob + b"\0", b"", struct.pack("<I", 1 << 30) + blob[4:],
               blob[:4] + blob[4:4 + size].replace(b'"labels": 3', b'"labels": 9') + blob[4 + size:],
               blob[:4] + b"[" + blob[5:]]
    for bad in damaged:
        with pytest.raises(DataCorrupt):
            sk.piece_of(bad, TOP)
    # an edge naming a vertex the label does not have
    bad_edges = sk.encode_fragment({5: sk.SkeletonPiece(np.zeros((2, 3), np.float32), np.array([[0, 7]], np.uint32),
                                                        np.zeros(2, np.float32))})
    with pytest.raises(DataCorrupt):
        sk.piece_of(bad_edges, 5)


def test_the_precomputed_file_and_info() -> None:
    piece = sk.SkeletonPiece(np.array([[0, 0, 0], [4, 0, 0], [8, 0, 0]], np.float32),
                             np.array([[0, 1], [1, 2]], np.uint32), np.array([1, 2, 3], np.float32))
    body = sk.merge_skeleton([piece])
    assert body is not None
    nv, ne = struct.unpack_from("<II", body)
    assert (nv, ne) == (3, 2) and len(body) == 8 + 12 * nv + 8 * ne + 4 * nv
    skel = Skeleton.from_precomputed(body, vertex_attributes=[sk.RADIUS])
    assert sorted(skel.radius.tolist()) == [1, 2, 3]
    assert sk.merge_skeleton([]) is None
    info = sk.info()
    assert info["@type"] == "neuroglancer_skeletons" and info["vertex_attributes"] == [sk.RADIUS]
    assert "sharding" not in info and sk.info(sk.SHARDS.sharding())["sharding"]["hash"] == "identity"


@pytest.mark.parametrize("spec", [ShardSpec(shard_bits=16), ShardSpec(shard_bits=3, minishard_bits=2),
                                  ShardSpec(shard_bits=2, minishard_bits=1, preshift_bits=3)])
def test_cloudvolumes_shard_reader_reads_a_shard_file(spec: ShardSpec) -> None:
    from cloudvolume.datasource.precomputed.sharding import ShardingSpecification, ShardReader

    keys = [5, TOP, HIGH, 2**40 + 5, 1 << 20, 77, 1 << 63]
    shard = spec.shard_of(keys[0])
    entries = {k: f"file of {k}".encode() * (k % 7 + 1) for k in keys if spec.shard_of(k) == shard}
    blob = shard_file(entries, spec)
    reader = ShardReader(None, None, ShardingSpecification.from_dict(spec.sharding()))
    location = reader.compute_shard_location(keys[0])
    assert location[0] == spec.shard_name(shard)
    index = reader.decode_index(blob[:16 << spec.minishard_bits])  # absolute [start, end) of each minishard index
    found = {}
    for start, end in index:
        for key, offset, size in reader.decode_minishard_index(blob[int(start):int(end)]):
            found[int(key)] = blob[int(offset):int(offset) + int(size)]
    assert found == entries
    with pytest.raises(ValueError):
        shard_file({k: b"" for k in keys}, spec)


def test_shard_names() -> None:
    spec = ShardSpec(shard_bits=16)
    assert spec.shard_name(10) == "000a.shard" and spec.shard_of_name("000a.shard") == 10
    for bad in ("a.shard", "000A.shard", "10000.shard", "000g.shard", "0000"):
        with pytest.raises(Exception, match="no shard"):
            spec.shard_of_name(bad)


def test_a_block_that_is_not_its_box_is_refused() -> None:
    box = Box((0, 0, 0), (16, 16, 4))
    for shape in [(4, 16, 18), (3, 16, 16), (4, 16), (6, 17, 17)]:
        with pytest.raises(ValueError, match="block of shape"):
            sk.skeleton_fragment(np.zeros(shape, np.uint32), box, (16, 16, 4), NM)
