"""Segmentation products kept current, end to end on a live stack (moto S3 + DynamoDB, Redis, the
local queue): a label channel written through the API; the runner's poller (the local stand-in
for the products Lambda) rebuilds what the writes marked; then the real clients read every
segment: CloudVolume 12.15.2's `mesh.get` and `skeleton.get` on the unsharded and the sharded
view. Each mesh is closed and watertight across the supercuboid seams (trimesh), its bounding box
is the label's within a voxel and its volume the voxel count's within 10%. A write that grows a
segment changes its mesh, skeleton, properties, ids and bounding box once its rebuild ran.

Rebuilds are run here by polling the queue until it is empty (with a timeout), as `ndstore
runner` does; the lag from write to mesh is measured in benchmarks/bench_segmentation.py."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from rest_framework.test import APIClient

from tests.api.test_precomputed import (  # noqa: F401  (the live server fixtures)
    loopback_only,
    make_frame_dataset,
    served,
)

OCTET = "application/octet-stream"
FRAME = (700, 96, 14)  # x y z: two uint64 supercuboids (512 x 512 x 8) in x, two in z
NM = (4.0, 4.0, 40.0)
BLOB, TOP = 7, 2**64 - 1
REBUILD_TIMEOUT_S = 240


def volume() -> np.ndarray:
    """A ball across the x seam (512) and the z seam (8), and a tube of the top label across the
    x seam; neither touches the volume's faces."""
    z, y, x = np.ogrid[:FRAME[2], :FRAME[1], :FRAME[0]]
    vol = np.zeros(FRAME[::-1], np.uint64)
    vol[((x - 512) * NM[0]) ** 2 + ((y - 40) * NM[1]) ** 2 + ((z - 7) * NM[2]) ** 2 < 120.0 ** 2] = BLOB
    vol[((y - 80) * NM[1]) ** 2 + ((z - 7) * NM[2]) ** 2 + 0 * x < 30.0 ** 2] = TOP
    vol[:, :, :420] *= vol[:, :, :420] != TOP  # the tube runs x 420 .. 690
    vol[:, :, 690:] *= vol[:, :, 690:] != TOP
    return vol


def rebuild_all(timeout_s: float = REBUILD_TIMEOUT_S) -> int:
    """Poll the service's queues as the runner does until the products queue is empty."""
    from lambdas.runner import QueuePoller
    from ndstore.wiring import services

    products = services().products
    assert products is not None
    queue, _ = products._products_queue()
    poller = QueuePoller(queue.queues, services().config.ingest_queue_prefix, refresh_s=0)
    handled, deadline = 0, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        handled += poller.poll_once()
        left = products.queued()
        if left.waiting == 0 and left.in_flight == 0:
            return handled
    raise AssertionError(f"rebuilds still queued after {timeout_s} s: {products.queued()}")


def public_label_channel(admin: APIClient, vol: np.ndarray, voxel_nm: tuple[float, float, float] = NM) -> None:
    """The public uint64 channel `seg/e1/ann` of ``vol`` (z, y, x), written through direct I/O,
    its products rebuilt by the pipeline."""
    frame = vol.shape[::-1]
    ds = make_frame_dataset(admin, "seg", lo=(0, 0, 0), hi=frame, voxel=voxel_nm, unit="nanometers",
                            method="anisotropic", levels=1, channels={"ann": "uint64"})
    assert admin.put("/v1/collection/seg/", {"public": True}, format="json").status_code == 200
    r = admin.generic("POST", ds.cutout("ann", 0, (0, frame[0]), (0, frame[1]), (0, frame[2]), direct=True),
                      vol.tobytes(), content_type=OCTET)
    assert r.status_code == 201, r.content
    status = admin.get("/v1/segmentation/seg/e1/ann/").json()
    assert status["stale"] == 4, status  # every supercuboid of the volume, marked by the write
    assert rebuild_all() >= 4
    assert admin.get("/v1/segmentation/seg/e1/ann/").json()["stale"] == 0


@pytest.fixture
def labelled(admin: APIClient) -> np.ndarray:
    vol = volume()
    public_label_channel(admin, vol)
    return vol


def cloudvolume(url: str) -> Any:
    from cloudvolume import CloudVolume

    return CloudVolume(f"precomputed://{url}", mip=0, cache=False, progress=False, parallel=1)


def label_box_nm(vol: np.ndarray, label: int) -> tuple[np.ndarray, np.ndarray]:
    z, y, x = np.nonzero(vol == label)
    return np.array([x.min(), y.min(), z.min()]) * NM, np.array([x.max() + 1, y.max() + 1, z.max() + 1]) * NM


def check_mesh(mesh: Any, vol: np.ndarray, label: int) -> None:
    import trimesh

    surface = trimesh.Trimesh(np.asarray(mesh.vertices, float), np.asarray(mesh.faces), process=True)
    surface.merge_vertices()
    assert surface.is_watertight, (label, len(surface.faces))
    lo, hi = label_box_nm(vol, label)
    assert np.all(np.abs(surface.bounds[0] - lo) <= np.array(NM) + 1e-3), (label, surface.bounds, lo, hi)
    assert np.all(np.abs(surface.bounds[1] - hi) <= np.array(NM) + 1e-3), (label, surface.bounds, lo, hi)
    voxels = float((vol == label).sum()) * NM[0] * NM[1] * NM[2]
    assert abs(abs(surface.volume) - voxels) <= 0.1 * voxels, (label, surface.volume, voxels)


def check_skeleton(skel: Any, vol: np.ndarray, label: int) -> None:
    assert len(skel.vertices) > 2 and len(skel.components()) == 1, label
    assert (skel.radius > 0).all()
    lo, hi = label_box_nm(vol, label)
    assert (skel.vertices >= lo - 1e-3).all() and (skel.vertices <= hi + 1e-3).all(), label


@pytest.mark.parametrize("view", ["precomputed", "precomputed-sharded"])
def test_cloudvolume_reads_every_mesh_and_skeleton(served: str, admin: APIClient, loopback_only: None,  # noqa: F811
                                                   labelled: np.ndarray, view: str) -> None:
    cv = cloudvolume(f"{served}/{view}/seg/e1/ann")
    for label in (BLOB, TOP):
        mesh = cv.mesh.get(label)
        mesh = mesh[label] if isinstance(mesh, dict) else mesh
        check_mesh(mesh, labelled, label)
        check_skeleton(cv.skeleton.get(label), labelled, label)


def test_a_write_that_grows_a_segment_changes_its_products(served: str, admin: APIClient,  # noqa: F811
                                                           loopback_only: None,  # noqa: F811
                                                           labelled: np.ndarray) -> None:
    before_mesh = cloudvolume(f"{served}/precomputed/seg/e1/ann").mesh.get(BLOB)
    before_mesh = before_mesh[BLOB] if isinstance(before_mesh, dict) else before_mesh
    grown = labelled.copy()
    grown[4:10, 30:50, 530:660] = BLOB  # a bar out of the ball, along x
    r = admin.generic("POST", "/v1/direct/cutout/seg/e1/ann/0/530:660/30:50/4:10/",
                      grown[4:10, 30:50, 530:660].tobytes(), content_type=OCTET)
    assert r.status_code == 201, r.content
    assert admin.get(f"/v1/segmentation/seg/e1/ann/?segment={BLOB}").json()["stale"] >= 1
    rebuild_all()
    cv = cloudvolume(f"{served}/precomputed/seg/e1/ann")
    mesh = cv.mesh.get(BLOB)
    mesh = mesh[BLOB] if isinstance(mesh, dict) else mesh
    assert mesh.vertices[:, 0].max() > before_mesh.vertices[:, 0].max() + 30 * NM[0]
    check_mesh(mesh, grown, BLOB)
    check_skeleton(cv.skeleton.get(BLOB), grown, BLOB)
    assert cv.skeleton.get(BLOB).vertices[:, 0].max() > 600 * NM[0]
    box = admin.get(f"/v1/boundingbox/seg/e1/ann/0/{BLOB}/?type=tight").json()
    assert box["x_range"][1] == 660
    ids = admin.get("/v1/ids/seg/e1/ann/0/600:700/0:96/0:14/").json()["ids"]
    assert str(BLOB) in ids
