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


def upload_tiles(stack: Stack, job: dict[str, Any], volume: np.ndarray) -> None:
    """Lease and upload every tile through the service, with the upload client's own code."""
    import queue

    import requests

    from ndstore.client.ingest import IngestClient, JobShape, ServiceRefused, _upload_batch
    from tests.faults.conftest import TOKEN

    client, shape = IngestClient(stack.url, TOKEN), JobShape.of(job)

    def read(tile: TileRef) -> bytes:
        x0, y0 = tile.x_index * 256, tile.y_index * 256
        return encode_tile(volume[tile.z, y0:y0 + 256, x0:x0 + 256], "png")

    reports: queue.Queue[Any] = queue.Queue()
    with requests.Session() as store:
        while tasks := client.lease(shape.job_id, 10)["tasks"]:
            try:
                _upload_batch(client, store, shape, tasks, read, reports)
            except ServiceRefused as exc:  # the batch outlasted its lease: its tasks come back
                assert exc.status == 400 and "lease" in str(exc), exc
    outcomes = [reports.get()[0] for _ in range(reports.qsize())]
    # A lease lasts this stack's 3 s visibility timeout: on a slow machine a batch can outlast it;
    # its URLs are then refused (or its tiles, arriving late) and its tiles leased and uploaded
    # again (the job's counters below still count each tile once).
    assert set(outcomes) == {"uploaded"} and len(outcomes) >= 16, outcomes


def channel_prefix(stack: Stack, collection: str) -> str:
    """The start of the channel's supercuboid names: its ids, from the stack's metadata database."""
    import sqlite3

    with sqlite3.connect(stack.local.data_dir / "meta.sqlite3") as db:
        ids = db.execute("SELECT col.id, e.id, ch.id FROM ndstore_channel ch "
                         "JOIN ndstore_experiment e ON ch.experiment_id = e.id "
                         "JOIN ndstore_collection col ON e.collection_id = col.id "
                         "WHERE col.name = ? AND e.name = 'e' AND ch.name = 'c'", (collection,)).fetchone()
    return "&".join(str(i) for i in ids) + "&"


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
    name = "ing1" if point.startswith("storing") else "ing2"
    ch = stack.channel(name, (1024, 1024, 64))
    job = start_job(stack, ch)
    prefix = channel_prefix(stack, name)
    bucket, cleanup_queue = stack.env["NDSTORE_S3_BUCKET"], job["queues"]["cleanup"]

    def at_the_point(c: Call) -> bool:
        if point.startswith("storing"):
            return c.method == "PUT" and c.path.startswith(f"/{bucket}/") and f"&{prefix}" in c.path
        return c.operation.startswith("SendMessage") and f"/{cleanup_queue}\"".encode() in c.head

    volume = np.random.default_rng(6).integers(1, 256, BOX.shape_zyx, dtype=np.uint8)
    [worker] = stack.child_pids("lambdas.runner", "spawn_main")
    with stack.proxy.faults(Fault("hold", match=at_the_point)):
        upload_tiles(stack, job, volume)
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
