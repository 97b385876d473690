"""Skeletons of a label channel on a live stack (moto S3 + DynamoDB, Redis): labels written
through direct I/O, each supercuboid's fragment built with the core as the rebuild will
(its block and a one-voxel overlap into its high-side neighbours) and stored in the base tier,
then CloudVolume 12.15.2 reads each segment's skeleton from /precomputed/ and from
/precomputed-sharded/ (by Range): one connected skeleton with radii spanning the label."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from rest_framework.test import APIClient

from ndstore.core import morton
from ndstore.core.geometry import Box
from ndstore.core.segments import skeleton as sk
from tests.api.test_precomputed import (  # noqa: F401  (the live server fixtures)
    loopback_only,
    make_frame_dataset,
    served,
)

OCTET = "application/octet-stream"
FRAME = (700, 96, 12)  # x y z: two uint64 supercuboids (512 x 512 x 8) in x, two in z
NM = (4.0, 4.0, 40.0)
TUBE, THIN, BLOB = 2**64 - 1, 2**63 + 5, 7


def volume() -> np.ndarray:
    """A slanted tube across the x seam (at 512) and the z seam (at 8), a thin straight one across
    the x seam, a blob in the first supercuboid."""
    z, y, x = np.ogrid[:FRAME[2], :FRAME[1], :FRAME[0]]
    vol = np.zeros(FRAME[::-1], np.uint64)
    vol[((y - (20 + 0.06 * x)) ** 2 + ((z - (3 + 0.008 * x)) * 10) ** 2) < 13 ** 2] = TUBE
    vol[((y - 85) ** 2 + ((z - 6) * 10) ** 2 + 0 * x) < 7 ** 2] = THIN
    vol[((y - 60) ** 2 + (x - 100) ** 2 + ((z - 4) * 4) ** 2) < 14 ** 2] = BLOB
    return vol


def build_fragments(chan_name: str, vol: np.ndarray) -> None:
    """What the rebuild (the integrator's) stores: one fragment object per supercuboid."""
    from ndstore.api import lookups
    from ndstore.api.models import Channel
    from ndstore.wiring import services

    cv = lookups.channel_volume(Channel.objects.get(name=chan_name))
    key, grid, extent = cv.volume_key(0, 0), cv.grid(0), cv.extent(0)
    lo_index, hi_index = grid.index_range(extent)
    for ix in range(lo_index[0], hi_index[0]):
        for iy in range(lo_index[1], hi_index[1]):
            for iz in range(lo_index[2], hi_index[2]):
                box = grid.supercuboid_box((ix, iy, iz)).intersect(extent)
                assert box is not None
                reach = Box(box.lo, tuple(min(h + 1, e) for h, e in zip(box.hi, extent.hi)))  # type: ignore[arg-type]
                blob = sk.skeleton_fragment(vol[reach.slices_zyx()], box, grid.supercuboid, NM)
                if blob is not None:
                    services().fragments.put("skeleton", key.supercuboid(morton.encode_one(ix, iy, iz)), blob)


@pytest.fixture
def labelled(admin: APIClient) -> Iterator[np.ndarray]:
    ds = make_frame_dataset(admin, "sk", lo=(0, 0, 0), hi=FRAME, voxel=NM, unit="nanometers", method="anisotropic",
                            levels=1, channels={"ann": "uint64", "img8": "uint8"})
    assert admin.put("/v1/collection/sk/", {"public": True}, format="json").status_code == 200
    vol = volume()
    r = admin.generic("POST", ds.cutout("ann", 0, (0, FRAME[0]), (0, FRAME[1]), (0, FRAME[2]), direct=True),
                      vol.tobytes(), content_type=OCTET)
    assert r.status_code == 201, r.content
    build_fragments("ann", vol)
    yield vol


def check(skel: Any, vol: np.ndarray, label: int) -> None:
    """One connected skeleton with a positive radius per vertex, spanning the label's voxels."""
    assert len(skel.vertices) > 10 and len(skel.components()) == 1, label
    assert skel.radius.shape == (len(skel.vertices),) and (skel.radius > 0).all()
    z, y, x = np.nonzero(vol == label)
    lo, hi = np.array([x.min(), y.min(), z.min()]) * NM, np.array([x.max(), y.max(), z.max()]) * NM
    assert (skel.vertices >= lo - 1e-3).all() and (skel.vertices <= hi + 1e-3).all(), label
    span = skel.vertices.max(axis=0) - skel.vertices.min(axis=0)
    assert label == BLOB or span[0] >= (hi - lo)[0] - 8 * NM[0], (label, span, hi - lo)  # end to end along x


def cloudvolume(url: str) -> Any:
    from cloudvolume import CloudVolume

    return CloudVolume(f"precomputed://{url}", mip=0, cache=False, progress=False, parallel=1)


@pytest.mark.parametrize("view", ["precomputed", "precomputed-sharded"])
def test_cloudvolume_reads_every_skeleton(served: str, admin: APIClient, loopback_only: None,  # noqa: F811
                                          labelled: np.ndarray, view: str) -> None:
    cv = cloudvolume(f"{served}/{view}/sk/e1/ann")
    assert cv.skeleton.meta.is_sharded() == (view == "precomputed-sharded")
    for label in (TUBE, THIN, BLOB):
        skel = cv.skeleton.get(label)
        assert int(skel.id) == label
        check(skel, labelled, label)


def test_the_files_as_served(admin: APIClient, labelled: np.ndarray) -> None:
    r = admin.get("/precomputed/sk/e1/ann/info")
    assert r.json()["skeletons"] == "skeletons"
    info = admin.get("/precomputed/sk/e1/ann/skeletons/info").json()
    assert info == {"@type": "neuroglancer_skeletons", "transform": [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0],
                    "vertex_attributes": [{"id": "radius", "data_type": "float32", "num_components": 1}],
                    "spatial_index": None}
    sharded = admin.get("/precomputed-sharded/sk/e1/ann/skeletons/info").json()
    assert sharded["sharding"]["@type"] == "neuroglancer_uint64_sharded_v1"
    r = admin.get(f"/precomputed/sk/e1/ann/skeletons/{TUBE}")
    assert r.status_code == 200 and r["Content-Type"] == OCTET and r.has_header("ETag")
    nv, ne = struct.unpack_from("<II", r.content)
    assert len(r.content) == 8 + 16 * nv + 8 * ne
    assert admin.get(f"/precomputed/sk/e1/ann/skeletons/{TUBE}", HTTP_IF_NONE_MATCH=r["ETag"]).status_code == 304
    head = admin.head(f"/precomputed/sk/e1/ann/skeletons/{TUBE}")
    assert head.status_code == 200 and head["Content-Length"] == str(len(r.content)) and not head.content
    # a label with no voxels, and one present in no fragment
    assert admin.get("/precomputed/sk/e1/ann/skeletons/12345").status_code == 404
    # a shard: its index names the segment's minishard index; a Range reads a part of it
    name = sk.SHARDS.shard_name(sk.shard_of(TUBE))
    whole = admin.get(f"/precomputed-sharded/sk/e1/ann/skeletons/{name}")
    assert whole.status_code == 200 and r.content in whole.content
    part = admin.get(f"/precomputed-sharded/sk/e1/ann/skeletons/{name}", HTTP_RANGE="bytes=0-15")
    assert part.status_code == 206 and part.content == whole.content[:16]
    empty = admin.get(f"/precomputed-sharded/sk/e1/ann/skeletons/{sk.SHARDS.shard_name(1234)}")
    assert empty.status_code == 200 and empty.content == struct.pack("<QQ", 0, 0)


def test_image_channels_have_no_skeletons(admin: APIClient, labelled: np.ndarray) -> None:
    for path in ("precomputed/sk/e1/img8/skeletons/info", "precomputed/sk/e1/img8/skeletons/5",
                 "precomputed-sharded/sk/e1/img8/skeletons/0005.shard"):
        r = admin.get(f"/{path}")
        assert r.status_code == 404 and "label" in json.dumps(r.json()), path


def test_a_channel_the_label_index_does_not_serve_is_a_503(admin: APIClient, labelled: np.ndarray,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from ndstore.wiring import services

    monkeypatch.setattr(services().fragments, "labels", None)
    for path in (f"precomputed/sk/e1/ann/skeletons/{TUBE}", "precomputed-sharded/sk/e1/ann/skeletons/0005.shard"):
        r = admin.get(f"/{path}")
        assert r.status_code == 503 and "label index" in r.json()["message"], (path, r.json())
