"""An upload URL is worth no more than the leave behind it (issue 47, item 6).

What the report found: after a user's write grant was revoked, a URL minted before wrote the
whole supercuboid into the channel; URLs could be minted without a lease (so for every tile, in
advance); URLs still took PUTs after the job was cancelled or completed, and the files stayed.

Now a URL is minted only for a task the caller holds on lease, works only until that lease ends,
and a tile is ingested only while its job is live and its uploader's leave stands: the service
revokes the leave when the uploader loses write permission (ndstore/api/ingest_leaves.py), and
the handlers check it when a tile arrives and again when its supercuboid is built. A tile that
comes late is refused and removed, by the local store's route (before its body is read) and by
the tile-uploaded handler (S3, where the PUT itself cannot be stopped)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest
import requests
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from ndstore.core.tiles import encode_tile
from tests.api.conftest import client_for, make_dataset
from tests.security.conftest import CountingBody, wsgi
from tests.security.test_ingest_grants import run_pipeline

BOX = {"x_start": 0, "x_stop": 512, "y_start": 0, "y_stop": 512, "z_start": 0, "z_stop": 2,
       "tile_size_x": 256, "tile_size_y": 256}  # 8 tiles, one supercuboid
PRIOR = 5


def tile_image(value: int) -> bytes:
    return encode_tile(np.full((256, 256), value, np.uint8), "png")


def lease_all(client: APIClient, job: int) -> list[dict[str, Any]]:
    tasks: list[dict[str, Any]] = []
    while (r := client.post(f"/v1/ingest/{job}/tasks/", {"max": 10}, format="json")).json().get("tasks"):
        tasks += r.json()["tasks"]
    assert r.status_code == 200, r.content
    return tasks


def mint(client: APIClient, job: int, tasks: list[dict[str, Any]], body: bytes) -> Any:
    return client.post(f"/v1/ingest/{job}/uploads/", {"tiles": [
        {**t, "sha256": hashlib.sha256(body).hexdigest(), "size": len(body)} for t in tasks]}, format="json")


@pytest.fixture
def lab(admin: APIClient, ingest_env: str) -> Iterator[tuple[APIClient, int]]:
    """A writer on collection `lab` (frame of 512 x 512 x 16, channel holding PRIOR) with an
    ingest job of 8 tiles there; yields the writer's client and the job's id."""
    from ndstore.api.models import Collection, Grant

    make_dataset(admin, name="lab", frame=(512, 512, 16), levels=1)
    prior = np.full((2, 512, 512), PRIOR, np.uint8).tobytes()
    assert admin.generic("POST", "/v1/cutout/lab/e1/img8/0/0:512/0:512/0:2/", prior,
                         content_type="application/octet-stream").status_code == 201
    user = User.objects.create(username="writer")
    Grant.objects.create(user=user, collection=Collection.objects.get(name="lab"), level="write")
    writer = client_for(user)
    r = writer.post("/v1/ingest/", {"collection": "lab", "experiment": "e1", "channel": "img8", **BOX}, format="json")
    assert r.status_code == 201, r.content
    yield writer, r.json()["id"]


def cutout(client: APIClient) -> np.ndarray:
    r = client.get("/v1/cutout/lab/e1/img8/0/0:512/0:512/0:2/", HTTP_ACCEPT="application/octet-stream")
    assert r.status_code == 200, r.content
    return np.frombuffer(r.content, np.uint8).reshape(2, 512, 512)


def revoke(admin: APIClient, how: str = "grant deleted") -> None:
    """Take the writer's write permission on the lab away."""
    if how == "grant deleted":
        r = admin.delete("/v1/permissions/?user=writer&collection=lab")
        assert r.status_code == 204, r.content
    elif how == "grant lowered to read":
        r = admin.post("/v1/permissions/", {"user": "writer", "collection": "lab", "level": "read"}, format="json")
        assert r.status_code == 201, r.content
    else:
        user = User.objects.get(username="writer")
        user.is_active = False
        user.save()


def bucket_keys(job: int) -> list[str]:
    """The job's tiles in the tile bucket."""
    import boto3

    from ndstore.wiring import services

    config = services().config
    s3 = boto3.client("s3", endpoint_url=config.ingest_endpoint_url)
    return [o["Key"] for o in s3.list_objects_v2(Bucket=config.tile_bucket, Prefix=f"{job}/").get("Contents", [])]


@pytest.mark.parametrize("how", ["grant deleted", "grant lowered to read", "user deactivated"])
def test_urls_minted_before_the_grant_was_revoked_ingest_nothing(admin: APIClient, lab: tuple[APIClient, int],
                                                                 how: str) -> None:
    writer, job = lab
    tasks = lease_all(writer, job)
    grants = mint(writer, job, tasks, tile_image(200)).json()["uploads"]
    for grant in grants[:4]:
        assert requests.put(grant["url"], data=tile_image(200), headers=grant["headers"], timeout=30).status_code == 200
    run_pipeline()
    assert admin.get(f"/v1/ingest/{job}/").json()["status"]["tiles"]["uploaded"] == 4

    revoke(admin, how)
    for grant in grants[4:]:  # S3 takes the PUTs (the URLs were signed): the handler must refuse them
        assert requests.put(grant["url"], data=tile_image(200), headers=grant["headers"], timeout=30).status_code == 200
    run_pipeline()
    status = admin.get(f"/v1/ingest/{job}/").json()["status"]
    assert status["tiles"]["uploaded"] == 4 and status["supercuboids"]["built"] == 0
    assert (cutout(admin) == PRIOR).all(), "a revoked uploader's tiles were written into the channel"
    late = {urlsplit(g["url"]).path.split("/", 2)[2] for g in grants[4:]}
    assert not late & set(bucket_keys(job)), "the refused tiles stayed in the bucket"


def test_tiles_recorded_before_the_revocation_are_not_built_after_it(admin: APIClient,
                                                                     lab: tuple[APIClient, int]) -> None:
    from ndstore.wiring import services

    writer, job = lab
    ingest = services().ingest
    grants = mint(writer, job, lease_all(writer, job), tile_image(200)).json()["uploads"]
    for grant in grants:
        assert requests.put(grant["url"], data=tile_image(200), headers=grant["headers"], timeout=30).status_code == 200
    for key in [urlsplit(g["url"]).path.split("/", 2)[2] for g in grants]:
        assert ingest.tile_uploaded(key) in ("recorded", "queued")  # every tile in: its supercuboid is queued
    revoke(admin)
    run_pipeline()  # the build: refused (and dead-lettered after its tries), nothing written
    assert admin.get(f"/v1/ingest/{job}/").json()["status"]["supercuboids"]["built"] == 0
    assert (cutout(admin) == PRIOR).all(), "tiles of a revoked uploader were built into the channel"


def test_a_url_is_minted_only_for_a_task_the_caller_holds_on_lease(admin: APIClient,
                                                                   lab: tuple[APIClient, int]) -> None:
    writer, job = lab
    body = tile_image(7)
    never = {"tile": [0, 0, 0, 0], "receipt": "made-up"}
    r = mint(writer, job, [never], body)
    assert r.status_code == 400 and "not on lease to you" in r.json()["message"], r.content
    theirs = admin.post(f"/v1/ingest/{job}/tasks/", {"max": 1}, format="json").json()["tasks"]  # an admin's lease
    r = mint(writer, job, theirs, body)
    assert r.status_code == 400 and "not on lease to you" in r.json()["message"], r.content
    mine = writer.post(f"/v1/ingest/{job}/tasks/", {"max": 1}, format="json").json()["tasks"][0]
    forged = {**mine, "tile": [0, 1, 1, 1] if mine["tile"] != [0, 1, 1, 1] else [0, 0, 0, 0]}
    r = mint(writer, job, [forged], body)  # a real receipt, for another tile
    assert r.status_code == 400 and "not on lease to you" in r.json()["message"], r.content
    r = writer.post(f"/v1/ingest/{job}/tasks/failed/", {"tasks": [{**never, "error": "x"}]}, format="json")
    assert r.status_code == 400 and "not on lease to you" in r.json()["message"], r.content
    assert mint(writer, job, [mine], body).status_code == 200


def test_a_url_is_not_minted_after_its_lease_ended(admin: APIClient, ingest_env: str) -> None:
    make_dataset(admin, name="short", frame=(512, 512, 16), levels=1)
    r = admin.post("/v1/ingest/", {"collection": "short", "experiment": "e1", "channel": "img8", **BOX,
                                   "visibility_timeout_s": 1}, format="json")
    job = r.json()["id"]
    leased_at = time.monotonic()
    task = admin.post(f"/v1/ingest/{job}/tasks/", {"max": 1}, format="json").json()["tasks"][0]
    while time.monotonic() < leased_at + 2.5:  # the lease of 1 s has ended
        time.sleep(0.1)
    r = mint(admin, job, [task], tile_image(7))
    assert r.status_code == 400 and "lease of tile" in r.json()["message"] and "ended" in r.json()["message"]


def test_a_tile_that_comes_after_its_lease_ended_is_refused_and_removed(admin: APIClient,
                                                                        lab: tuple[APIClient, int]) -> None:
    """S3 checks a presigned URL's expiry (the lease's end); moto does not, and a PUT begun in
    time may end late: the handler compares the object's Last-Modified with the lease."""
    from ndstore.wiring import services

    writer, job = lab
    ingest = services().ingest
    now = time.time()
    ingest.clock = lambda: now - 600  # the lease was given ten minutes ago (it lasts 120 s here)
    try:
        [grant] = mint(writer, job, lease_all(writer, job)[:1], tile_image(9)).json()["uploads"]
    finally:
        ingest.clock = time.time
    assert requests.put(grant["url"], data=tile_image(9), headers=grant["headers"], timeout=30).status_code == 200
    key = urlsplit(grant["url"]).path.split("/", 2)[2]
    assert ingest.tile_uploaded(key) == "refused"
    assert bucket_keys(job) == [] and admin.get(f"/v1/ingest/{job}/").json()["status"]["tiles"]["uploaded"] == 0


def test_a_presigned_put_after_cancel_leaves_no_tile(admin: APIClient, lab: tuple[APIClient, int]) -> None:
    from ndstore.wiring import services

    writer, job = lab
    grants = mint(writer, job, lease_all(writer, job)[:2], tile_image(9)).json()["uploads"]
    assert writer.delete(f"/v1/ingest/{job}/").status_code == 204
    for grant in grants:  # S3 takes them: the handler refuses and removes them
        assert requests.put(grant["url"], data=tile_image(9), headers=grant["headers"], timeout=30).status_code == 200
    ingest = services().ingest
    for grant in grants:
        assert ingest.tile_uploaded(urlsplit(grant["url"]).path.split("/", 2)[2]) in ("refused", "ignored")
    assert bucket_keys(job) == []
    run_pipeline()  # and the job's removal finds nothing more
    assert bucket_keys(job) == [] and (cutout(admin) == PRIOR).all()


# -- the local tile store's own route -----------------------------------------------------------


@pytest.fixture
def local_ingest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The local ingest backend (the default of `ndstore up`) in a data dir of the test's own;
    yields the folder of its tiles."""
    from ndstore import wiring

    monkeypatch.setenv("NDSTORE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("NDSTORE_INGEST_BACKEND", "local")
    monkeypatch.setenv("NDSTORE_INGEST_PUBLIC_ENDPOINT_URL", "http://testserver")
    monkeypatch.delenv("NDSTORE_INGEST_ENDPOINT_URL", raising=False)
    wiring.services.cache_clear()
    yield tmp_path / "ingest" / "tiles" / "objects"
    wiring.services.cache_clear()


def put_local(target: dict[str, Any], body: bytes | CountingBody) -> Any:
    url = urlsplit(target["url"])
    return wsgi("PUT", url.path, body, content_type="image/png", query=url.query,
                extra={f"HTTP_{k.upper().replace('-', '_')}": v for k, v in target["headers"].items()})


def tile_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


@pytest.mark.parametrize("end", ["cancel", "complete"])
def test_a_put_to_the_local_route_after_the_job_ended_is_refused_unread(admin: APIClient, local_ingest: Path,
                                                                         end: str) -> None:
    from lambdas.runner import QueuePoller
    from ndstore.wiring import services

    make_dataset(admin, name="loc", frame=(512, 512, 16), levels=1)
    job = admin.post("/v1/ingest/", {"collection": "loc", "experiment": "e1", "channel": "img8", **BOX,
                                     "x_stop": 256, "y_stop": 256, "z_stop": 1}, format="json").json()["id"]
    body = tile_image(9)
    [task] = lease_all(admin, job)
    first, second = (mint(admin, job, [task], body).json()["uploads"][0] for _ in range(2))  # two URLs, one lease
    if end == "cancel":
        assert admin.delete(f"/v1/ingest/{job}/").status_code == 204
    else:
        assert put_local(first, body).status == 200
        ingest = services().ingest
        poller = QueuePoller(ingest.queues, ingest.queue_prefix, refresh_s=0)
        deadline = time.monotonic() + 60
        while admin.post(f"/v1/ingest/{job}/complete/").status_code != 200:
            assert time.monotonic() < deadline, "the one-tile job did not finish"
            poller.poll_once()
    counting = CountingBody(len(body))
    answer = put_local(second, counting)
    assert answer.status == 409 and "stopped" in answer.json()["message"], answer.body
    assert counting.read_bytes == 0 and tile_files(local_ingest) == []
