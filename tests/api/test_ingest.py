"""`/v1/ingest/`: creating, reading, cancelling and completing jobs; every refusal names its
reason; the Lambda handlers take the AWS event formats."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from rest_framework.test import APIClient

from ndstore.core.errors import NotFound
from ndstore.core.tiles import TileRef, encode_tile
from tests.api.conftest import Dataset
from tests.ingest.conftest import put_signed

JOB = {"collection": "c1", "experiment": "e1", "channel": "img8", "x_start": 0, "x_stop": 512, "y_start": 0,
       "y_stop": 256, "z_start": 0, "z_stop": 3, "tile_size_x": 256, "tile_size_y": 256}


@pytest.fixture(autouse=True)
def _ingest_wired(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from ndstore import wiring

    suffix = uuid.uuid4().hex[:10]
    monkeypatch.setenv("NDSTORE_INGEST_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("NDSTORE_TILE_BUCKET", f"tiles-{suffix}")
    monkeypatch.setenv("NDSTORE_TILE_INDEX_TABLE", f"tiles-{suffix}")
    monkeypatch.setenv("NDSTORE_INGEST_QUEUE_PREFIX", f"api-{suffix}")
    wiring.services.cache_clear()


def test_a_job_names_its_queues_and_reports_progress(admin: APIClient, dataset: Dataset) -> None:
    r = admin.post("/v1/ingest/", JOB, format="json")
    assert r.status_code == 201, r.content
    job = r.json()
    assert job["state"] == "uploading" and job["box"] == {"x": [0, 512], "y": [0, 256], "z": [0, 3]}
    assert set(job["queues"]) == {"upload", "supercuboid", "cleanup"} and job["tile_count"] == 6
    assert not {"endpoint_url", "tile_bucket", "tile_index_table", "spec"} & set(job)  # nothing but the service
    status = admin.get(f"/v1/ingest/{job['id']}/").json()["status"]
    assert status["tiles"] == {"total": 6, "uploaded": 0, "queued_for_upload": 0}
    assert status["supercuboids"] == {"total": 1, "built": 0, "cleaned": 0}
    assert [j["id"] for j in admin.get("/v1/ingest/").json()["jobs"]] == [job["id"]]

    r = admin.post(f"/v1/ingest/{job['id']}/complete/")
    assert r.status_code == 409 and "0 of 6 tiles uploaded" in r.json()["message"]


@pytest.mark.parametrize(("change", "message"), [
    ({"tile_size_x": 384}, "tile_x 384 must divide the supercuboid extent 512"),
    ({"x_stop": 5000}, "outside the coordinate frame"),
    ({"x_start": 100}, "must start on the tile grid"),
    ({"z_stop": None}, "z_stop is required"),
    ({"z_stop": "ten"}, "z_stop must be an integer"),
    ({"file_format": "jpeg"}, "file_format 'jpeg' is not one of png, tif, tiff"),
    ({"t_stop": 5}, "time range 0:5 is not inside the experiment's 0:1"),
    ({"channel": "nope"}, "channel c1/e1/nope does not exist"),
])
def test_a_job_that_cannot_work_is_refused_with_the_reason(admin: APIClient, dataset: Dataset,
                                                           change: dict[str, Any], message: str) -> None:
    body = {k: v for k, v in {**JOB, **change}.items() if v is not None}
    r = admin.post("/v1/ingest/", body, format="json")
    assert r.status_code in (400, 404), r.content
    assert message in r.json()["message"]


@pytest.mark.parametrize("value", [10**12, 43201, 0, -1, "60", 1.5, True, None])
def test_a_lease_time_out_of_range_is_refused_and_creates_nothing(admin: APIClient, dataset: Dataset,
                                                                  value: Any) -> None:
    """Before, 10**12 (or a negative number) made the job's row, then failed to make its queues:
    a job "uploading" forever with no queues. SQS takes 0 to 43200 s; a lease of 0 s holds nothing."""
    from ndstore.wiring import services

    r = admin.post("/v1/ingest/", {**JOB, "visibility_timeout_s": value}, format="json")
    assert r.status_code == 400, r.content
    assert "visibility_timeout_s must be an integer from 1 to 43200" in r.json()["message"], r.content
    assert admin.get("/v1/ingest/").json()["jobs"] == []
    ingest = services().ingest
    assert [q for q in ingest.queues.names(ingest.queue_prefix) if not q.endswith(("-tile-events", "-reap"))] == []
    assert admin.post("/v1/ingest/", {**JOB, "visibility_timeout_s": 43200}, format="json").status_code == 201


def test_a_job_whose_queues_cannot_be_made_leaves_no_row(admin: APIClient, dataset: Dataset,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from ndstore import wiring
    from ndstore.ops.localstack import free_port

    monkeypatch.setenv("NDSTORE_INGEST_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens
    wiring.services.cache_clear()
    assert admin.post("/v1/ingest/", JOB, format="json").status_code == 503
    assert admin.get("/v1/ingest/").json()["jobs"] == []


def test_only_writers_of_the_channel_may_ingest(dataset: Dataset, grant: Any) -> None:
    assert APIClient().post("/v1/ingest/", JOB, format="json").status_code == 401
    reader = grant("reader", "c1", "read")
    r = reader.post("/v1/ingest/", JOB, format="json")
    assert r.status_code == 403 and "write permission" in r.json()["message"]
    writer = grant("writer", "c1", "write")
    job = writer.post("/v1/ingest/", JOB, format="json").json()
    assert reader.get(f"/v1/ingest/{job['id']}/").status_code == 403
    assert writer.get(f"/v1/ingest/{job['id']}/").status_code == 200
    assert writer.get("/v1/ingest/99999/").status_code == 404


def test_cancelling_a_job_removes_its_queues_and_tiles(admin: APIClient, dataset: Dataset) -> None:
    from lambdas.runner import QueuePoller
    from ndstore.wiring import services

    job = admin.post("/v1/ingest/", JOB, format="json").json()
    assert admin.post(f"/v1/ingest/{job['id']}/tasks/", {"max": 1}, format="json").status_code == 200  # queues 6
    ingest = services().ingest
    spec = ingest.job(job["id"])
    key = spec.tile_key(TileRef(0, 0, 0, 0))
    ingest.tiles.put(key, b"tile", {})
    ingest.url(spec.queue("supercuboid"))  # cached by this process
    assert admin.delete(f"/v1/ingest/{job['id']}/").status_code == 204
    assert ingest.queues.url(spec.queue("upload")) is None
    with pytest.raises(NotFound, match="does not exist"):  # the cached URL went with the queue
        ingest.url(spec.queue("supercuboid"))
    assert admin.get(f"/v1/ingest/{job['id']}/").json()["state"] == "cancelled"
    r = admin.delete(f"/v1/ingest/{job['id']}/")
    assert r.status_code == 409 and "cancelled already" in r.json()["message"]
    # its tiles and rows go in the background: the runner's steps on the removal queue
    poller = QueuePoller(ingest.queues, ingest.queue_prefix, refresh_s=0)
    for _ in range(20):
        if not poller.poll_once() and ingest.index.job_spec(str(job["id"])) is None:
            break
    assert ingest.tiles.metadata(key) is None and ingest.index.job_spec(str(job["id"])) is None


def test_a_channel_with_a_job_in_progress_cannot_be_deleted(admin: APIClient, dataset: Dataset) -> None:
    job = admin.post("/v1/ingest/", JOB, format="json").json()
    channel = "/v1/collection/c1/experiment/e1/channel/img8/"
    r = admin.delete(channel)
    assert r.status_code == 409 and f"ingest jobs in progress ({job['id']})" in r.json()["message"]
    assert admin.get(channel).status_code == 200
    assert admin.delete(f"/v1/ingest/{job['id']}/").status_code == 204
    assert admin.delete(channel).status_code == 204


def test_the_tile_handler_takes_a_direct_s3_trigger_event(admin: APIClient, dataset: Dataset) -> None:
    import numpy as np

    from lambdas import ingest as handlers
    from ndstore.wiring import services

    job = admin.post("/v1/ingest/", {**JOB, "z_stop": 1, "x_stop": 256}, format="json").json()
    ingest = services().ingest
    spec = ingest.job(job["id"])
    key = spec.tile_key(TileRef(0, 0, 0, 0))
    put_signed(ingest, spec, TileRef(0, 0, 0, 0), encode_tile(np.full((256, 256), 7, np.uint8), "png"))
    event = {"Records": [{"eventSource": "aws:s3", "eventName": "ObjectCreated:Put",
                          "s3": {"bucket": {"name": ingest.tiles.bucket}, "object": {"key": key.replace("/", "%2F")}}}]}
    assert handlers.tile_uploaded(event) == {"batchItemFailures": []}
    assert ingest.tile_uploaded("notes/readme.txt") == "ignored"  # not a tile: nothing to retry
    assert ingest.tile_uploaded("99999/0/0/0/0.png") == "ignored"  # no such job (completed, cancelled)
    tasks = ingest.queues.receive(ingest.url(spec.queue("supercuboid")), 10, wait_s=0)
    assert len(tasks) == 1
    sqs_event = {"Records": [{"messageId": "m1", "body": tasks[0].body, "eventSource": "aws:sqs"},
                             {"messageId": "m2", "body": json.dumps({"job": 99999, "t": 0, "index": [0, 0, 0]}),
                              "eventSource": "aws:sqs"}]}
    assert handlers.supercuboid(sqs_event) == {"batchItemFailures": [{"itemIdentifier": "m2"}]}
    r = admin.get("/v1/cutout/c1/e1/img8/0/0:256/0:256/0:1/", HTTP_ACCEPT="application/octet-stream")
    assert set(r.content) == {7}


def test_on_aws_a_jobs_queues_trigger_the_phase_functions(admin: APIClient, dataset: Dataset, moto_endpoint: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """With NDSTORE_INGEST_*_FUNCTION set, creating a job maps its supercuboid and cleanup queues
    to those Lambda functions (moto's Lambda API here), and cancelling removes the mappings."""
    from ndstore import wiring
    from tests.conftest import moto_lambda_function

    functions = {}
    for phase in ("supercuboid", "cleanup"):
        functions[phase] = moto_lambda_function(moto_endpoint, f"lambdas.ingest.{phase}")
        monkeypatch.setenv(f"NDSTORE_INGEST_{phase.upper()}_FUNCTION", functions[phase])
    wiring.services.cache_clear()
    job = admin.post("/v1/ingest/", JOB, format="json").json()
    ingest = wiring.services().ingest
    assert ingest.triggers is not None
    spec = ingest.job(job["id"])
    for phase, arn in functions.items():
        mappings = ingest.triggers[0].mappings(ingest.queues.arn(ingest.url(spec.queue(phase))))
        assert [m["FunctionArn"] for m in mappings] == [arn]
    upload_arn = ingest.queues.arn(ingest.url(spec.queue("upload")))
    assert ingest.triggers[0].mappings(upload_arn) == []  # the upload queue is the client's
    queue_arns = {p: ingest.queues.arn(ingest.url(spec.queue(p))) for p in functions}
    assert admin.delete(f"/v1/ingest/{job['id']}/").status_code == 204
    assert all(ingest.triggers[0].mappings(a) == [] for a in queue_arns.values())


def test_an_uploader_leases_tasks_and_puts_tiles_with_presigned_urls(admin: APIClient, dataset: Dataset) -> None:
    """The upload client's routes, end to end: lease, leave to upload (a presigned PUT per
    tile), the tile handler, the supercuboid build; a tile it cannot read is reported."""
    import hashlib

    import numpy as np
    import requests

    from lambdas.runner import QueuePoller
    from ndstore.wiring import services

    job = admin.post("/v1/ingest/", {**JOB, "z_stop": 2}, format="json").json()
    leased: list[dict[str, Any]] = []
    while True:
        r = admin.post(f"/v1/ingest/{job['id']}/tasks/", {"max": 3}, format="json")
        assert r.status_code == 200, r.content
        if not r.json()["tasks"]:
            break
        leased += r.json()["tasks"]
    assert sorted(t["tile"] for t in leased) == [[0, z, 0, x] for z in range(2) for x in range(2)]
    broken, good = leased[0], leased[1:]
    r = admin.post(f"/v1/ingest/{job['id']}/tasks/failed/", {"tasks": [{**broken, "error": "unreadable"}]},
                   format="json")
    assert r.status_code == 200 and r.json() == {"failed": 1}
    tiles = {tuple(t["tile"]): encode_tile(np.full((256, 256), 40 + t["tile"][3], np.uint8), "png") for t in good}
    r = admin.post(f"/v1/ingest/{job['id']}/uploads/",
                   {"tiles": [{**t, "sha256": hashlib.sha256(tiles[tuple(t["tile"])]).hexdigest(),
                               "size": len(tiles[tuple(t["tile"])])} for t in good]}, format="json")
    assert r.status_code == 200, r.content
    for target in r.json()["uploads"]:
        assert "Authorization" not in target["headers"] and target["method"] == "PUT"
        assert requests.put(target["url"], data=tiles[tuple(target["tile"])], headers=target["headers"],
                            timeout=30).status_code == 200
    ingest = services().ingest
    poller = QueuePoller(ingest.queues, ingest.queue_prefix, refresh_s=0.2)
    for _ in range(100):
        poller.poll_once()
        status = admin.get(f"/v1/ingest/{job['id']}/").json()["status"]
        if status["tiles"]["uploaded"] == 3 and status["supercuboids"]["built"] == 0:
            break
    assert status["tiles"]["uploaded"] == 3 and status["queues"]["upload"]["failed"] == 1
    assert status["failed_tiles"][0]["error"] == "unreadable"
    assert admin.post(f"/v1/ingest/{job['id']}/tasks/", {"max": 3}, format="json").json()["done"]


@pytest.mark.parametrize(("route", "body", "message"), [
    ("tasks/", {"max": 0}, "max must be an integer from 1 to 100"),
    ("tasks/", {"max": "9"}, "max must be an integer"),
    ("uploads/", {"tiles": []}, "a list of 1 to 100 objects"),
    ("uploads/", {"tiles": [{"tile": [0, 0, 0, 9], "receipt": "r", "sha256": "0" * 64, "size": 9}]},
     "not part of this ingest"),
    ("uploads/", {"tiles": [{"tile": [0, 0, 0, 2], "receipt": "r", "sha256": "0" * 64, "size": 9}]},
     "not part of this ingest"),
    ("uploads/", {"tiles": [{"tile": [0, 0, 0], "receipt": "r", "sha256": "0" * 64, "size": 9}]}, "a tile is [t, z"),
    ("uploads/", {"tiles": [{"tile": [0, 0, 0, 0], "receipt": "r", "sha256": "zz", "size": 9}]}, "64 lowercase hex"),
    ("uploads/", {"tiles": [{"tile": [0, 0, 0, 0], "sha256": "0" * 64, "size": 9}]}, "'receipt' as a string"),
    ("uploads/", {"tiles": [{"tile": [0, 0, 0, 0], "receipt": "r", "sha256": "0" * 64}]}, "'size': the tile file's"),
    ("uploads/", {"tiles": [{"tile": [0, 0, 0, 0], "receipt": "r", "sha256": "0" * 64, "size": 9}]},
     "not on lease to you: lease its task first"),
    ("tasks/failed/", {"tasks": [{"tile": [0, 3, 0, 0], "receipt": "r", "error": "x"}]}, "not part of this ingest"),
    ("tasks/failed/", {"tasks": [{"tile": [0, 0, 0, 0], "receipt": "r", "error": "x"}]}, "not on lease to you"),
])
def test_upload_routes_name_what_is_wrong(admin: APIClient, dataset: Dataset, route: str, body: dict[str, Any],
                                          message: str) -> None:
    job = admin.post("/v1/ingest/", JOB, format="json").json()
    r = admin.post(f"/v1/ingest/{job['id']}/{route}", body, format="json")
    assert r.status_code == 400 and message in r.json()["message"], r.content
