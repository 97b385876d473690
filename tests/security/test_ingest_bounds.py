"""Ingest work is bounded by what it produces (issue 47, item 8).

What the report found: 16 tiles of a valid 512x512 PNG padded with 40 MiB each grew the runner by
663 MiB for 4 MiB of voxels (tiles were taken up to 1 GiB, and the supercuboid handler held all
of a supercuboid's tiles at once); cancelling a job of 1,048,576 tiles took 18 s and 519 MiB in
one web worker; a lease took 0.43 s with 60,000 tasks queued.

Now a tile holds at most twice its voxels plus 64 KiB (refused at the upload from its declared
length, before the body is read, and by the handlers from its size, before it is read); the
supercuboid handler decodes one tile at a time; cancel stops the job and returns, its tiles and
rows going in the background a bounded step at a time; a lease reads only the tasks it hands out.
Work is measured, not time: Python allocations (tracemalloc), SQLite virtual-machine steps and
Python calls."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest
import requests
from rest_framework.test import APIClient

from ndstore.core.tiles import encode_tile
from tests.api.conftest import make_dataset
from tests.security.conftest import CountingBody, wsgi

MiB = 1 << 20
TILE_BOUND = 2 * 512 * 512 + 64 * 1024  # a 512 x 512 tile of an 8-bit channel: twice its voxels + 64 KiB


@pytest.fixture
def local_ingest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The local ingest backend in a data dir of the test's own (no fsync: the tests measure work)."""
    from ndstore import wiring

    monkeypatch.setenv("NDSTORE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("NDSTORE_INGEST_BACKEND", "local")
    monkeypatch.setenv("NDSTORE_INGEST_PUBLIC_ENDPOINT_URL", "http://testserver")
    monkeypatch.setenv("NDSTORE_FSYNC", "0")
    monkeypatch.delenv("NDSTORE_INGEST_ENDPOINT_URL", raising=False)
    wiring.services.cache_clear()
    yield tmp_path / "ingest" / "tiles" / "objects"
    wiring.services.cache_clear()


@dataclass
class Work:
    sql_steps: int = 0  # SQLite virtual-machine instructions, in hundreds
    python_calls: int = 0
    peak_bytes: int = 0  # Python allocations at their highest, above where they started


@contextmanager
def measured(monkeypatch: pytest.MonkeyPatch) -> Iterator[Work]:
    """The work done inside the block: every SQLite connection opened in it counts its steps."""
    work, connect = Work(), sqlite3.connect

    def counting(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = connect(*args, **kwargs)

        def step() -> int:
            work.sql_steps += 1
            return 0

        conn.set_progress_handler(step, 100)
        return conn

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            work.python_calls += 1

    with monkeypatch.context() as patch:
        patch.setattr(sqlite3, "connect", counting)
        tracemalloc.start()
        sys.setprofile(profile)
        try:
            yield work
        finally:
            sys.setprofile(None)
            work.peak_bytes = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()


def new_job(admin: APIClient, collection: str, box: dict[str, int], channel: str = "img8") -> int:
    r = admin.post("/v1/ingest/", {"collection": collection, "experiment": "e1", "channel": channel, **box},
                   format="json")
    assert r.status_code == 201, r.content
    return int(r.json()["id"])


def queue_manifest(job_id: int, count: int) -> None:
    """The job's first `count` upload tasks queued (as `count / 500` leases would have)."""
    from ndstore.engine.ingest import upload_task
    from ndstore.wiring import services

    ingest = services().ingest
    spec = ingest.job(job_id)
    tasks = [upload_task(spec, t) for _, t in zip(range(count), spec.layout.manifest())]
    ingest.queues.send(ingest.url(spec.queue("upload")), tasks)
    assert ingest.index.advance_manifest(spec.name, 0, count)


# A job of 102,400 tiles: 64 x 64 tiles, 16 x 16 per slice, 400 slices.
BIG = {"x_start": 0, "x_stop": 1024, "y_start": 0, "y_stop": 1024, "z_start": 0, "z_stop": 400,
       "tile_size_x": 64, "tile_size_y": 64}


def test_a_lease_reads_no_more_when_the_queue_is_longer(admin: APIClient, local_ingest: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    make_dataset(admin, name="big", frame=(1024, 1024, 512), levels=1)
    short, long = new_job(admin, "big", BIG), new_job(admin, "big", BIG)
    queue_manifest(short, 1_000)
    queue_manifest(long, 60_000)

    def lease(job: int) -> Work:
        admin.post(f"/v1/ingest/{job}/tasks/", {"max": 10}, format="json")  # warm: caches, the next chunk queued
        with measured(monkeypatch) as work:
            r = admin.post(f"/v1/ingest/{job}/tasks/", {"max": 10}, format="json")
        assert r.status_code == 200 and len(r.json()["tasks"]) == 10, r.content
        return work

    few, many = lease(short), lease(long)
    # before: 60 times the SQLite steps (a redrive check and a count over every queued task) and
    # 30 times the Python calls (the manifest walked to its position) for 60 times the queue
    assert many.sql_steps < 1.5 * few.sql_steps + 100, (few, many)
    assert many.python_calls < 1.5 * few.python_calls, (few, many)


def test_a_cancel_returns_at_once_and_the_job_goes_a_bounded_step_at_a_time(admin: APIClient, local_ingest: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from lambdas.runner import QueuePoller
    from ndstore.wiring import services

    make_dataset(admin, name="big", frame=(1024, 1024, 512), levels=1)
    small, large = new_job(admin, "big", BIG), new_job(admin, "big", BIG)
    queue_manifest(small, 10_000)
    queue_manifest(large, 100_000)

    def cancel(job: int) -> Work:
        with measured(monkeypatch) as work:
            assert admin.delete(f"/v1/ingest/{job}/").status_code == 204
        return work

    few, many = cancel(small), cancel(large)
    # before: every tile's key built and deleted in the request (102,400 of them: 10 MiB), and
    # the queue's tasks deleted in one statement (ten times the steps for ten times the tasks)
    assert many.peak_bytes < 2 * MiB, many
    assert many.sql_steps < 1.5 * few.sql_steps + 100, (few, many)

    ingest = services().ingest
    poller = QueuePoller(ingest.queues, ingest.queue_prefix, refresh_s=0)
    steps, peaks = 0, []
    while ingest.index.job_spec(str(small)) is not None:  # its 10,000 queued tiles, 1000 a step
        steps += 1
        assert steps < 40, "the removal did not end"
        tracemalloc.start()
        try:
            poller.poll_once()  # a step of each job's removal
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    assert steps >= 10 and max(peaks) < 2 * MiB, (steps, max(peaks))
    assert all(ingest.index.supercuboid(f"{small}&0&{m}") == ingest.index.supercuboid("none") for m in range(8))
    [step] = [json.loads(m.body) for m in ingest.queues.peek(ingest.url(ingest.reap_queue))]
    assert step == {"reap": large, "from": 1000 * steps, "tiles": True}  # the large job's, as far along


def padded(value: int, size: int) -> bytes:
    """A valid 512 x 512 PNG padded after its end to `size` bytes (a decoder stops at IEND)."""
    png = encode_tile(np.full((512, 512), value, np.uint8), "png")
    return png + b"\0" * (size - len(png))


def lease(admin: APIClient, job: int) -> dict[str, Any]:
    [task] = admin.post(f"/v1/ingest/{job}/tasks/", {"max": 1}, format="json").json()["tasks"]
    return task  # type: ignore[no-any-return]


def mint(admin: APIClient, job: int, task: dict[str, Any], body: bytes) -> Any:
    return admin.post(f"/v1/ingest/{job}/uploads/", {"tiles": [
        {**task, "sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}]}, format="json")


ONE_TILE = {"x_start": 0, "x_stop": 512, "y_start": 0, "y_stop": 512, "z_start": 0, "z_stop": 1,
            "tile_size_x": 512, "tile_size_y": 512}


def test_a_tile_over_its_bound_is_refused_at_the_upload_before_it_is_read(admin: APIClient,
                                                                         local_ingest: Path) -> None:
    make_dataset(admin, name="pad", frame=(512, 512, 64), levels=1)
    job = new_job(admin, "pad", ONE_TILE)
    task = lease(admin, job)
    r = mint(admin, job, task, padded(7, 40 * MiB))
    assert r.status_code == 413 and f"at most {TILE_BOUND}" in r.json()["message"], r.content
    body = padded(7, TILE_BOUND)  # the largest a tile of this job may be
    target = mint(admin, job, task, body).json()["uploads"][0]
    url = urlsplit(target["url"])
    meta = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in target["headers"].items()}
    counting = CountingBody(40 * MiB)  # a longer body than the URL was signed for
    answer = wsgi("PUT", url.path, counting, content_type="image/png", query=url.query, extra=meta)
    assert answer.status == 413 and counting.read_bytes == 0, answer.body
    answer = wsgi("PUT", url.path, body, content_type="image/png", query=url.query, extra=meta)
    assert answer.status == 200, answer.body
    assert [p.stat().st_size for p in local_ingest.rglob("*~tile")][0] < TILE_BOUND + 4096


def test_the_handler_refuses_an_oversized_tile_by_its_size_unread(admin: APIClient, ingest_env: str) -> None:
    from ndstore.wiring import services

    make_dataset(admin, name="pads3", frame=(512, 512, 64), levels=1)
    job = new_job(admin, "pads3", ONE_TILE)
    target = mint(admin, job, lease(admin, job), padded(7, 100_000)).json()["uploads"][0]
    assert "content-length" in urlsplit(target["url"]).query.lower()  # S3 itself refuses another length
    padding = padded(7, 16 * MiB)  # moto does not check signatures: the handler must
    assert requests.put(target["url"], data=padding, headers=target["headers"], timeout=60).status_code == 200
    key = urlsplit(target["url"]).path.split("/", 2)[2]
    ingest = services().ingest
    calls: list[str] = []
    ingest.tiles._s3.meta.events.register("before-call.s3", lambda model, **_: calls.append(model.name))  # type: ignore[attr-defined]
    assert ingest.tile_uploaded(key) == "refused"
    assert calls == ["HeadObject", "DeleteObjects"]  # its size, then away: never a GET of its bytes
    assert ingest.tiles.head(key) is None


def build_peak(admin: APIClient, collection: str, channel: str, tile: Callable[[int], bytes]) -> int:
    """Upload a whole supercuboid (64 tiles of 512 x 512) made by `tile(z)`, and build it:
    the Python allocations of the build at their highest."""
    from ndstore.wiring import services

    ingest = services().ingest
    job = ingest.job(new_job(admin, collection, {**ONE_TILE, "z_stop": 64}, channel))
    for ref in job.layout.manifest():
        ingest.tile_uploaded(ingest.put_tile(job, ref, tile(ref.z), "no-task"))
    [task] = ingest.queues.receive(ingest.url(job.queue("supercuboid")), 10, wait_s=0)
    tracemalloc.start()
    try:
        ingest.build_supercuboid(task.body)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_supercuboid_is_built_from_its_tiles_one_at_a_time(admin: APIClient, local_ingest: Path) -> None:
    make_dataset(admin, name="build", frame=(512, 512, 64), levels=1,
                 channels={"warm": "uint8", "small": "uint8", "large": "uint8"})
    build_peak(admin, "build", "warm", lambda z: padded(z + 1, 0))  # what a first build allocates once
    compact = build_peak(admin, "build", "small", lambda z: padded(z + 1, 0))
    large = build_peak(admin, "build", "large", lambda z: padded(z + 1, TILE_BOUND))
    # 64 tiles of 576 KiB each (36 MiB) were all held at once before (27 MiB more at the peak
    # than compact tiles); now one at a time
    assert large - compact < 4 * TILE_BOUND, (compact, large)
