"""The attacker who ingests: a user with write permission on their own channel only, against a
victim with a private channel and an ingest job of her own (DESIGN §9: the server alone decides
what a job writes where).

What the report found: the handler took a job's target from a row the upload client could
rewrite; a tile put under another job's key (ids are sequential) was ingested into that job's
channel, and the job then reported the supercuboid built, so the owner's real tiles were
ignored; the uploader could list every job's tiles and use every job's queues.

Two reaches are tried. What a user really reaches (the API, their own presigned URLs, job ids):
the victim's job then completes with exactly her tiles. And everything in the pipeline's stores,
as the local endpoint handed out before (the bucket, the queues, the tile index rows): the
victim's voxels still never change but by her own, signed tiles."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import numpy as np
import pytest
import requests
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from ndstore.core.errors import InvalidRequest
from ndstore.core.tiles import TileRef, encode_tile
from ndstore.engine.ingest import Refused
from tests.api.conftest import client_for, make_dataset

BOX = {"x_start": 0, "x_stop": 512, "y_start": 0, "y_stop": 512, "z_start": 0, "z_stop": 2,
       "tile_size_x": 256, "tile_size_y": 256}  # 2 x 2 tiles per slice, 8 tiles, one supercuboid
PRIOR = 5  # what the victim's channel holds before the attacks


@dataclass
class Lab:
    client: APIClient
    collection: str
    job: int

    def cutout(self) -> np.ndarray:
        r = self.client.get(f"/v1/cutout/{self.collection}/e1/img8/0/0:512/0:512/0:2/",
                            HTTP_ACCEPT="application/octet-stream")
        assert r.status_code == 200, r.content
        return np.frombuffer(r.content, np.uint8).reshape(2, 512, 512)


def tile_image(value: int) -> bytes:
    return encode_tile(np.full((256, 256), value, np.uint8), "png")


@pytest.fixture
def labs(admin: APIClient, ingest_env: str) -> Iterator[tuple[Lab, Lab]]:
    """Alice (the victim: a private channel holding PRIOR, an ingest job) and Mallory (write on
    a channel of her own, an ingest job there)."""
    from ndstore.api.models import Collection, Grant

    out = []
    for name in ("alice", "mallory"):
        make_dataset(admin, name=name, frame=(512, 512, 16), levels=1)
        user = User.objects.create(username=name)
        Grant.objects.create(user=user, collection=Collection.objects.get(name=name), level="write")
        client = client_for(user)
        r = client.post("/v1/ingest/", {"collection": name, "experiment": "e1", "channel": "img8", **BOX},
                        format="json")
        assert r.status_code == 201, r.content
        out.append(Lab(client, name, r.json()["id"]))
    alice, mallory = out
    prior = np.full((2, 512, 512), PRIOR, np.uint8).tobytes()
    assert alice.client.generic("POST", "/v1/cutout/alice/e1/img8/0/0:512/0:512/0:2/", prior,
                                content_type="application/octet-stream").status_code == 201
    yield alice, mallory


def lease_all(lab: Lab, job: int | None = None) -> list[dict[str, Any]]:
    tasks: list[dict[str, Any]] = []
    while True:
        r = lab.client.post(f"/v1/ingest/{job or lab.job}/tasks/", {"max": 10}, format="json")
        assert r.status_code == 200, r.content
        if not r.json()["tasks"]:
            return tasks
        tasks += r.json()["tasks"]


def upload(lab: Lab, tasks: list[dict[str, Any]], value: int) -> list[dict[str, Any]]:
    """Leave to upload each tile (content `value`), then the PUTs; returns the grants."""
    body = tile_image(value)
    leave = {"sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}
    r = lab.client.post(f"/v1/ingest/{lab.job}/uploads/", {"tiles": [{**t, **leave} for t in tasks]}, format="json")
    assert r.status_code == 200, r.content
    grants: list[dict[str, Any]] = r.json()["uploads"]
    for grant in grants:
        assert requests.put(grant["url"], data=body, headers=grant["headers"], timeout=30).status_code == 200
    return grants


def run_pipeline(rounds: int = 60) -> None:
    """The local runner's poller until the queues are quiet."""
    from lambdas.runner import QueuePoller
    from ndstore.wiring import services

    ingest = services().ingest
    poller = QueuePoller(ingest.queues, ingest.queue_prefix, refresh_s=0.1)
    idle = 0
    for _ in range(rounds):
        idle = 0 if poller.poll_once() else idle + 1
        if idle >= 3:
            return


def status(lab: Lab) -> dict[str, Any]:
    return lab.client.get(f"/v1/ingest/{lab.job}/").json()["status"]  # type: ignore[no-any-return]


def test_through_what_a_user_reaches_the_victims_job_is_hers_alone(labs: tuple[Lab, Lab]) -> None:
    alice, mallory = labs
    # Another's job, by its (sequential) id: nothing to lease, no leave to upload, nothing to report.
    assert mallory.client.post(f"/v1/ingest/{alice.job}/tasks/", {"max": 10}, format="json").status_code == 403
    fake = {"tile": [0, 0, 0, 0], "receipt": "r", "sha256": "0" * 64, "size": 9}
    for route, body in (("uploads/", {"tiles": [fake]}), ("tasks/failed/", {"tasks": [{**fake, "error": "x"}]})):
        assert mallory.client.post(f"/v1/ingest/{alice.job}/{route}", body, format="json").status_code == 403
    for method in ("get", "delete"):
        assert getattr(mallory.client, method)(f"/v1/ingest/{alice.job}/").status_code == 403
    assert mallory.client.post(f"/v1/ingest/{alice.job}/complete/").status_code == 403
    # Her own job: leave only for its own tiles, each bound to its key and content.
    r = mallory.client.post(f"/v1/ingest/{mallory.job}/uploads/",
                            {"tiles": [{**fake, "tile": [0, 5, 0, 0]}]}, format="json")
    assert r.status_code == 400 and "not part of this ingest" in r.json()["message"]
    grants = upload(mallory, lease_all(mallory)[:1], 66)
    assert all(f"/{mallory.job}/0/" in g["url"] for g in grants)
    # Her signed leave, replayed for the victim's key of the same tile (the store's signature
    # check aside, which moto does not make): the handler refuses it.
    from ndstore.wiring import services

    ingest = services().ingest
    alice_key = f"{alice.job}/0/0/0/0.png"
    headers = {k: v for k, v in grants[0]["headers"].items()}
    requests.put(grants[0]["url"].replace(f"/{mallory.job}/0/", f"/{alice.job}/0/").split("?")[0],
                 data=tile_image(66), headers=headers, timeout=30)  # moto keeps it; AWS would refuse the PUT
    assert ingest.tile_uploaded(alice_key) == "refused"

    run_pipeline()
    assert (alice.cutout() == PRIOR).all() and status(alice)["tiles"]["uploaded"] == 0
    # The victim uploads her real tiles: every one is recorded and built, none ignored.
    upload(alice, lease_all(alice), 200)
    run_pipeline()
    assert status(alice)["tiles"]["uploaded"] == 8 and status(alice)["supercuboids"]["built"] == 1
    assert (alice.cutout() == 200).all()


def test_with_every_store_of_the_pipeline_in_reach_the_victims_voxels_never_change(labs: tuple[Lab, Lab],
                                                                                   moto_endpoint: str) -> None:
    from ndstore.wiring import services

    alice, mallory = labs
    ingest = services().ingest
    config = services().config
    s3, dynamo, sqs = (boto3.client(s, endpoint_url=moto_endpoint) for s in ("s3", "dynamodb", "sqs"))
    bucket, table = config.tile_bucket, config.tile_index_table

    # Alice has uploaded half of her tiles, legitimately.
    alice_tasks = lease_all(alice)
    alice_grants = upload(alice, alice_tasks[:4], 200)
    run_pipeline()
    assert status(alice)["tiles"]["uploaded"] == 4
    mallory_grant = upload(mallory, lease_all(mallory)[:1], 66)[0]  # leave for a tile of her own

    # 1. Mallory rewrites her own job's record to name Alice's channel, then uploads a tile.
    row = dynamo.get_item(TableName=table, Key={"key": {"S": str(mallory.job)}})["Item"]
    signature, _, spec = row["spec"]["S"].partition(" ")
    victim = json.loads(ingest.job(alice.job).to_json())["channel"]
    forged = json.dumps({**json.loads(spec), "channel": victim})
    dynamo.put_item(TableName=table, Item={**row, "spec": {"S": f"{signature} {forged}"}})
    # 2. ... or copies Alice's whole sealed record under her own job's key.
    alice_row = dynamo.get_item(TableName=table, Key={"key": {"S": str(alice.job)}})["Item"]
    ingest._jobs.clear()
    assert ingest.tile_uploaded(f"{mallory.job}/0/0/0/0.png") == "ignored"
    dynamo.put_item(TableName=table, Item={**alice_row, "key": {"S": str(mallory.job)}})
    ingest._jobs.clear()
    assert ingest.tile_uploaded(f"{mallory.job}/0/0/0/0.png") == "ignored"
    # 3. Tiles straight into the bucket under Alice's keys: unsigned, with Mallory's metadata,
    #    and over one of Alice's uploaded tiles with Alice's own metadata (other content).
    theirs = [TileRef(*t["tile"]) for t in alice_tasks[4:]]
    s3.put_object(Bucket=bucket, Key=f"{alice.job}/0/{theirs[0].z}/{theirs[0].y_index}/{theirs[0].x_index}.png",
                  Body=tile_image(66))
    metadata = {k.removeprefix("x-amz-meta-"): v for k, v in mallory_grant["headers"].items()}
    for tile in theirs[1:]:
        s3.put_object(Bucket=bucket, Key=f"{alice.job}/0/{tile.z}/{tile.y_index}/{tile.x_index}.png",
                      Body=tile_image(66), Metadata=metadata)
    first = alice_grants[0]
    key = first["url"].split("?")[0].split(f"/{bucket}/", 1)[1]
    s3.put_object(Bucket=bucket, Key=key, Body=tile_image(66),
                  Metadata={k.removeprefix("x-amz-meta-"): v for k, v in first["headers"].items()})
    # 4. Index rows: Alice's supercuboid marked complete, and its task forged into her queue,
    #    with a task for a supercuboid outside her job.
    sc_row = f"{alice.job}&0&0"
    dynamo.update_item(TableName=table, Key={"key": {"S": sc_row}}, UpdateExpression="ADD tiles :all",
                       ExpressionAttributeValues={":all": {"NS": [str(i) for i in range(8)]}})
    queue = sqs.get_queue_url(QueueName=f"{ingest.queue_prefix}-{alice.job}-supercuboid")["QueueUrl"]
    forged_tasks = [json.dumps({"job": alice.job, "t": 0, "index": index}) for index in ([0, 0, 0], [3, 3, 0])]
    sqs.send_message_batch(QueueUrl=queue, Entries=[{"Id": str(i), "MessageBody": b}
                                                    for i, b in enumerate(forged_tasks)])
    with pytest.raises(Refused, match="not the content its uploader was given leave to send|signature"):
        ingest.build_supercuboid(forged_tasks[0])
    with pytest.raises(InvalidRequest, match="outside the ingest box"):
        ingest.build_supercuboid(forged_tasks[1])
    run_pipeline()
    assert (alice.cutout() == PRIOR).all(), "the victim's voxels changed"
    assert status(alice)["supercuboids"]["built"] == 0
