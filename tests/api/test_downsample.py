"""`/v1/downsample/{c}/{e}/{ch}/`: Boss v1 shapes, admin-only start and cancel, progress, and the
built level readable through the cutout API."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from rest_framework.test import APIClient

from tests.api.conftest import make_dataset

pytestmark = pytest.mark.usefixtures("ingest_env")
URL = "/v1/downsample/ds/e1/img8/"


def run_queues(until: Any, timeout: float = 120) -> None:
    from lambdas.runner import QueuePoller
    from ndstore.wiring import services

    runs = services().downsample_runs
    poller = QueuePoller(runs.queues, runs.queue_prefix, refresh_s=0.2)
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "the build did not finish"
        if not poller.poll_once():
            time.sleep(0.2)


def test_a_build_runs_to_downsampled_and_the_levels_read_back(admin: APIClient) -> None:
    make_dataset(admin, "ds", frame=(1100, 700, 16), levels=3)
    data = np.random.default_rng(3).integers(0, 255, (16, 700, 1100), dtype=np.uint8)
    r = admin.post("/v1/cutout/ds/e1/img8/0/0:1100/0:700/0:16/", data.tobytes(),
                   content_type="application/octet-stream")
    assert r.status_code == 201, r.content
    before = admin.get(URL).json()
    assert before["status"] == "NOT_DOWNSAMPLED" and before["num_hierarchy_levels"] == 3
    assert before["extent"] == {"0": [1100, 700, 16], "1": [550, 350, 16], "2": [275, 175, 16]}
    assert before["cuboid_size"]["1"] == [128, 128, 16]
    r = admin.post(URL)
    assert r.status_code == 201, r.content
    assert r.json()["status"] == "IN_PROGRESS" and r.json()["job"]["levels"]["1"]["total"] == 2
    again = admin.post(URL)
    assert again.status_code == 409 and "in progress" in again.json()["message"]
    run_queues(lambda: admin.get(URL).json()["status"] != "IN_PROGRESS")
    done = admin.get(URL).json()
    assert done["status"] == "DOWNSAMPLED" and done["job"]["state"] == "DOWNSAMPLED"
    assert admin.get("/v1/collection/ds/experiment/e1/channel/img8/").json()["downsample_status"] == "DOWNSAMPLED"
    level2 = admin.get("/v1/cutout/ds/e1/img8/2/0:275/0:175/0:16/", HTTP_ACCEPT="application/octet-stream")
    assert level2.status_code == 200
    got = np.frombuffer(level2.content, np.uint8).reshape(16, 175, 275)
    expect = data[:, :700, :1100].reshape(16, 175, 4, 275, 4).astype(np.float64).mean(axis=(2, 4))
    assert np.abs(got.astype(np.float64) - expect).max() <= 1.0  # two rounded means in a row


def test_only_admins_start_or_cancel_and_cancel_needs_a_build(admin: APIClient, grant: Any) -> None:
    make_dataset(admin, "ds")
    writer = grant("writer", "ds", "write")
    r = writer.post(URL)
    assert r.status_code == 403 and "admin permission on ds/e1/img8" in r.json()["message"]
    assert writer.get(URL).status_code == 200
    assert APIClient().post(URL).status_code == 401
    r = admin.delete(URL)
    assert r.status_code == 409 and "no downsample" in r.json()["message"]
    assert admin.post(URL).json()["status"] == "DOWNSAMPLED"  # nothing stored: nothing to build
    r = admin.post("/v1/cutout/ds/e1/img8/0/0:64/0:64/0:4/", np.ones((4, 64, 64), np.uint8).tobytes(),
                   content_type="application/octet-stream")
    assert r.status_code == 201
    assert admin.post(URL).json()["status"] == "IN_PROGRESS"  # no runner polls in this test
    r = admin.delete("/v1/collection/ds/experiment/e1/channel/img8/")
    assert r.status_code == 409 and "being downsampled" in r.json()["message"]
    assert admin.delete(URL).status_code == 204
    body = admin.get(URL).json()
    assert body["status"] == "NOT_DOWNSAMPLED" and body["job"]["state"] == "CANCELLED"
    assert admin.get("/v1/downsample/ds/e1/nope/").status_code == 404


def test_on_aws_a_builds_queue_triggers_the_downsample_function(admin: APIClient, moto_endpoint: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from ndstore import wiring
    from tests.conftest import moto_lambda_function

    function = moto_lambda_function(moto_endpoint, "lambdas.downsample.parent")
    monkeypatch.setenv("NDSTORE_DOWNSAMPLE_FUNCTION", function)
    wiring.services.cache_clear()
    make_dataset(admin, "ds")
    admin.post("/v1/cutout/ds/e1/img8/0/0:64/0:64/0:4/", np.ones((4, 64, 64), np.uint8).tobytes(),
               content_type="application/octet-stream")
    job = admin.post(URL).json()["job"]
    runs = wiring.services().downsample_runs
    assert runs.trigger is not None
    queue_arn = runs.queues.arn(runs.queues.url(f"{runs.queue_prefix}-ds-{job['id']}") or "")
    assert [m["FunctionArn"] for m in runs.trigger[0].mappings(queue_arn)] == [function]
    assert admin.delete(URL).status_code == 204
    assert runs.trigger[0].mappings(queue_arn) == []
