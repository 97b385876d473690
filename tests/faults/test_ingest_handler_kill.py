"""An ingest handler process killed with SIGKILL half way through a supercuboid task.

tests/ingest covers a handler that raises (its record reported failed and retried) and an upload
client killed halfway. Here the local runner's worker process dies in the middle of the
supercuboid phase, held at the fault proxy at one of two points: (1) storing the supercuboid
(its index entry written, the object PUT in flight), (2) queueing the cleanup task (the
supercuboid stored and counted as built). Nothing reports the failure: the SQS message comes back
after its visibility timeout, the runner has started another worker, and the rerun must give
the right volume with exact counters and nothing in a dead-letter queue. Meanwhile a read sees
the supercuboid whole or not at all.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import numpy as np
import pytest

from ndstore.core.geometry import Box
from ndstore.core.tiles import TileRef, encode_tile
from tests.faults.conftest import Channel, Stack, wait_for, whole_or_nothing
from tests.faults.proxy import Call, Fault

pytestmark = pytest.mark.faults

BOX = Box((0, 0, 0), (512, 512, 4))  # 2 x 2 tiles of 256 per slice: 16 tiles, one supercuboid


def upload_tiles(job: dict[str, Any], volume: np.ndarray) -> None:
    """Queue the manifest and upload every tile, with the upload client's own per-task code."""
    import queue

    from ndstore.client.ingest import _Endpoints, _upload_one
    from ndstore.engine.ingest import fill_manifest

    spec, tiles, index, queues = _Endpoints.of(job).adapters()
    upload, dlq = queues.url(spec.queue("upload")), queues.url(f"{spec.queue('upload')}-dlq")
    assert upload and dlq
    for _ in fill_manifest(spec, index, queues, upload):
        pass

    def read(tile: TileRef) -> bytes:
        return encode_tile(volume[spec.layout.tile_box(tile).slices_zyx()][0], "png")

    reports: queue.Queue[Any] = queue.Queue()
    while messages := queues.receive(upload, 10, wait_s=0):
        for m in messages:
            _upload_one(m, spec, tiles, index, queues, upload, dlq, read, reports)
    assert reports.qsize() == 16


def start_job(stack: Stack, ch: Channel) -> dict[str, Any]:
    (x0, y0, z0), (x1, y1, z1) = BOX.lo, BOX.hi
    r = stack.session().post(f"{stack.url}/v1/ingest/", json={
        "collection": ch.collection, "experiment": "e", "channel": "c", "x_start": x0, "x_stop": x1,
        "y_start": y0, "y_stop": y1, "z_start": z0, "z_stop": z1, "t_start": 0, "t_stop": 1,
        "tile_size_x": 256, "tile_size_y": 256, "file_format": "png"})
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def status(stack: Stack, job_id: int) -> dict[str, Any]:
    return stack.session().get(f"{stack.url}/v1/ingest/{job_id}/").json()["status"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("point", ["storing the supercuboid", "queueing its cleanup"])
def test_an_ingest_handler_killed_half_way_is_rerun_from_its_queue(stack: Stack, point: str) -> None:
    from ndstore.engine.ingest import IngestJob

    name = "ing1" if point.startswith("storing") else "ing2"
    ch = stack.channel(name, (1024, 1024, 64))
    job = start_job(stack, ch)
    prefix = IngestJob.from_json(job["spec"]).channel.name_prefix
    bucket, cleanup_queue = stack.env["NDSTORE_S3_BUCKET"], job["queues"]["cleanup"]

    def at_the_point(c: Call) -> bool:
        if point.startswith("storing"):
            return c.method == "PUT" and c.path.startswith(f"/{bucket}/") and f"&{prefix}" in c.path
        return c.operation.startswith("SendMessage") and f"/{cleanup_queue}\"".encode() in c.head

    volume = np.random.default_rng(6).integers(1, 256, BOX.shape_zyx, dtype=np.uint8)
    [worker] = stack.child_pids("lambdas.runner", "spawn_main")
    with stack.proxy.faults(Fault("hold", match=at_the_point)):
        upload_tiles(job, volume)
        stack.proxy.wait_held(1, timeout=60)
        os.kill(worker, signal.SIGKILL)  # the handler dies there; its message stays in flight
        got = ch.read_ok(BOX, mode="raw")  # the base tier as it is (no lock to wait for): whole or nothing
        stored = ["old"] if point.startswith("storing") else ["new"]  # its index entry only / the object too
        assert whole_or_nothing(got, np.zeros_like(volume), volume, BOX) == stored
    done = wait_for(lambda: (s := status(stack, job["id"]))["supercuboids"]["cleaned"] == 1 and s,
                    "the rerun of the supercuboid task", timeout=90, every=0.2)
    assert done["tiles"] == {"total": 16, "uploaded": 16, "queued_for_upload": 16}
    assert done["supercuboids"] == {"total": 1, "built": 1, "cleaned": 1}  # counted once, rerun or not
    assert all(q["failed"] == 0 for q in done["queues"].values()), done["queues"]
    assert worker not in stack.child_pids("lambdas.runner", "spawn_main")  # the runner started another
    np.testing.assert_array_equal(ch.read_ok(BOX), volume)
    np.testing.assert_array_equal(ch.read_ok(BOX, mode="raw"), volume)
    r = stack.session().post(f"{stack.url}/v1/ingest/{job['id']}/complete/")
    assert r.status_code == 200 and r.json()["state"] == "complete", r.text
