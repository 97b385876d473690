"""Meshes of a label channel through the API, on the real adapters: a label channel written by
direct I/O (so the base tier and the label index hold it), its supercuboids' fragment objects
built with the core and stored (the rebuild pipeline's job), then read by CloudVolume 12.15.2
from a live server, unsharded and sharded: every segment closed across the seams, where its
voxels are. And the files by hand: info, manifest, Range of the data, shard, errors."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import trimesh
from rest_framework.test import APIClient

from ndstore.core import morton
from ndstore.core.geometry import Box
from ndstore.core.segments import mesh
from tests.api.conftest import Dataset
from tests.api.test_precomputed import (  # noqa: F401  (the live server fixtures)
    loopback_only,
    make_frame_dataset,
    served,
)

OCTET = "application/octet-stream"
TOP, HIGH = 2**64 - 1, 2**63
VOXEL = (4.0, 4.0, 40.0)
FRAME = Box((0, 0, 0), (600, 300, 12))  # 2 x 1 x 2 supercuboids of 512 x 512 x 8 (uint64, anisotropic)
LABELS = (TOP, HIGH, 5)


def blob_labels() -> np.ndarray:
    """Two touching blobs across the x and z seams, and a small one on the frame's low x face."""
    shape = FRAME.shape_zyx
    z, y, x = np.indices(shape)
    labels = np.zeros(shape, np.uint64)
    labels[((x - 500) / 40) ** 2 + ((y - 150) / 60) ** 2 + ((z - 7.5) / 4) ** 2 < 1] = TOP
    labels[(((x - 560) / 30) ** 2 + ((y - 150) / 50) ** 2 + ((z - 6) / 3) ** 2 < 1) & (labels == 0)] = HIGH
    labels[((x / 10) ** 2 + ((y - 40) / 12) ** 2 + ((z - 3) / 2) ** 2 < 1)] = 5
    return labels


def write_and_mesh(admin: APIClient, ds: Dataset, channel: str, labels: np.ndarray) -> None:
    """Write the labels (direct I/O) and store every supercuboid's mesh fragment object."""
    from ndstore.api import lookups
    from ndstore.api.models import Channel
    from ndstore.wiring import services

    url = ds.cutout(channel, 0, *zip(FRAME.lo, FRAME.hi), direct=True)
    r = admin.generic("POST", url, labels.tobytes(), content_type=OCTET)
    assert r.status_code == 201, r.content
    chan = Channel.objects.get(name=channel, experiment__name=ds.experiment,
                               experiment__collection__name=ds.collection)
    volume = lookups.channel_volume(chan)
    cell, extent = volume.grid(0).supercuboid, volume.extent(0)
    key = volume.volume_key(0, chan.default_time_sample)
    ranges = [range(lo // c, -(-hi // c)) for lo, hi, c in zip(extent.lo, extent.hi, cell)]
    for index in itertools.product(*ranges):
        box = Box(tuple(i * c for i, c in zip(index, cell)),  # type: ignore[arg-type]
                  tuple((i + 1) * c for i, c in zip(index, cell))).intersect(extent)  # type: ignore[arg-type]
        assert box is not None
        grown = Box(box.lo, tuple(min(h + 1, e) for h, e in zip(box.hi, extent.hi)))  # type: ignore[arg-type]
        blob = mesh.mesh_fragment(labels[grown.slices_zyx(extent.lo)], box, cell, VOXEL, extent=extent)
        if blob is not None:
            services().fragments.put("mesh", key.supercuboid(morton.encode_one(*index)), blob)


@pytest.fixture
def ms(admin: APIClient) -> Dataset:
    ds = make_frame_dataset(admin, "ms", lo=FRAME.lo, hi=FRAME.hi, voxel=VOXEL, unit="nanometers",
                            method="anisotropic", levels=1, channels={"ann64": "uint64", "img8": "uint8"})
    assert admin.put("/v1/collection/ms/", {"public": True}, format="json").status_code == 200
    return ds


def check_segment(got: trimesh.Trimesh, labels: np.ndarray, label: int) -> None:
    got.merge_vertices()
    assert got.is_watertight, f"segment {label} is open"
    z, y, x = np.nonzero(labels == label)
    want = np.array([[x.min(), y.min(), z.min()], [x.max() + 1, y.max() + 1, z.max() + 1]]) * np.array(VOXEL)
    assert np.all(np.abs(got.bounds - want) <= np.array(VOXEL)), (label, got.bounds, want)
    volume = len(x) * np.prod(VOXEL)
    assert abs(got.volume - volume) <= 0.1 * volume, (label, got.volume, volume)


@pytest.mark.parametrize("prefix", ["precomputed", "precomputed-sharded"])
def test_cloudvolume_reads_every_segments_mesh(served: str, admin: APIClient, ms: Dataset,  # noqa: F811
                                               loopback_only: None, prefix: str) -> None:  # noqa: F811
    from cloudvolume import CloudVolume

    labels = blob_labels()
    write_and_mesh(admin, ms, "ann64", labels)
    vol = CloudVolume(f"precomputed://{served}/{prefix}/ms/e1/ann64", cache=False, progress=False, parallel=1)
    for label in LABELS:
        got = vol.mesh.get(label)[label]
        check_segment(trimesh.Trimesh(got.vertices, got.faces, process=False), labels, label)


def test_the_files_by_hand(admin: APIClient, ms: Dataset) -> None:
    labels = blob_labels()
    write_and_mesh(admin, ms, "ann64", labels)
    info = admin.get("/precomputed/ms/e1/ann64/mesh/info")
    assert info.status_code == 200 and info["Content-Type"] == "application/json"
    assert info.json()["@type"] == "neuroglancer_multilod_draco" and "sharding" not in info.json()
    assert json.loads(admin.get("/precomputed/ms/e1/ann64/info").content)["mesh"] == "mesh"
    sharded = admin.get("/precomputed-sharded/ms/e1/ann64/mesh/info").json()
    assert sharded["sharding"]["@type"] == "neuroglancer_uint64_sharded_v1"
    manifest = admin.get(f"/precomputed/ms/e1/ann64/mesh/{TOP}.index")
    assert manifest.status_code == 200 and manifest["Content-Type"] == OCTET
    assert "Content-Encoding" not in manifest
    whole = admin.get(f"/precomputed/ms/e1/ann64/mesh/{TOP}")
    assert whole.status_code == 200 and "Content-Encoding" not in whole and len(whole.content) > 100
    part = admin.get(f"/precomputed/ms/e1/ann64/mesh/{TOP}", HTTP_RANGE="bytes=10-49")
    assert part.status_code == 206 and part.content == whole.content[10:50]
    assert part["Content-Range"] == f"bytes 10-49/{len(whole.content)}"
    shard = admin.get(f"/precomputed-sharded/ms/e1/ann64/mesh/{mesh.shard_name(mesh.shard_of(TOP))}")
    assert shard.status_code == 200 and whole.content in shard.content and manifest.content in shard.content
    empty = admin.get(f"/precomputed-sharded/ms/e1/ann64/mesh/{mesh.shard_name(1234)}")
    assert empty.status_code == 200 and empty.content == bytes(16)


@pytest.mark.parametrize(("path", "status", "words"), [
    ("/precomputed/ms/e1/ann64/mesh/77", 404, "has no mesh"),
    ("/precomputed/ms/e1/ann64/mesh/77.index", 404, "has no mesh"),
    ("/precomputed/ms/e1/ann64/mesh/0", 400, "out of range"),
    ("/precomputed/ms/e1/ann64/mesh/0.index", 400, "out of range"),
    (f"/precomputed/ms/e1/ann64/mesh/{2**64}", 400, "out of range"),
    ("/precomputed/ms/e1/ann64/mesh/-3", 400, "not a decimal"),
    ("/precomputed/ms/e1/ann64/mesh/0x10.index", 400, "not a decimal"),
    ("/precomputed/ms/e1/img8/mesh/info", 404, "image channel"),
    ("/precomputed/ms/e1/img8/mesh/5", 404, "image channel"),
    ("/precomputed-sharded/ms/e1/img8/mesh/0000.shard", 404, "image channel"),
    ("/precomputed-sharded/ms/e1/ann64/mesh/00000.shard", 404, "no mesh shard"),
    ("/precomputed-sharded/ms/e1/ann64/mesh/zzzz.shard", 404, "no mesh shard"),
])
def test_bad_ids_and_channels(admin: APIClient, ms: Dataset, path: str, status: int, words: str) -> None:
    r = admin.get(path)
    assert r.status_code == status and words in r.json()["message"], (r.status_code, r.content)
    assert r["Access-Control-Allow-Origin"] == "*"


def test_a_write_shows_once_its_fragments_are_rebuilt(admin: APIClient, ms: Dataset) -> None:
    """What the view serves is what the stored objects say (the rebuild keeps them current)."""
    labels = blob_labels()
    write_and_mesh(admin, ms, "ann64", labels)
    before = admin.get("/precomputed/ms/e1/ann64/mesh/5.index").content
    labels[labels == 5] = 0
    labels[2:6, 200:260, 100:180] = 5
    write_and_mesh(admin, ms, "ann64", labels)
    assert admin.get("/precomputed/ms/e1/ann64/mesh/5.index").content != before
    r = admin.get("/precomputed/ms/e1/ann64/mesh/5", HTTP_RANGE="bytes=0-15")
    assert r.status_code == 206
