"""The supercuboid index lost while the service was stopped (its table emptied; a deleted SQLite
file does the same). On main reads were fine but a bounding box answered 404, a downsample build
reported DOWNSAMPLED with an empty level 1 and deleting the channel left every object behind.
Now the start marks the index stale, the downsample and the delete are refused with a 503 naming
the fix, the bounding box of a label channel answers from its label index (a table of its own),
and `ndstore reindex` rebuilds the index from the object store's self-describing keys."""

from __future__ import annotations

import io
import os

import boto3
import numpy as np
import pytest
from click.testing import CliRunner
from django.core.management import call_command
from rest_framework.test import APIClient

from ndstore.core.keys import SupercuboidKey
from tests.api.conftest import make_dataset
from tests.api.test_downsample import run_queues

pytestmark = pytest.mark.usefixtures("ingest_env")
OCTET = "application/octet-stream"


def stored_keys_of(channel_prefix: str) -> list[str]:
    from ndstore.wiring import services

    return [k for k in services().objects.list_keys() if k.count("&") == 6
            and SupercuboidKey.parse(k).name.startswith(channel_prefix)]


def empty_the_index(moto_endpoint: str) -> None:
    db, table = boto3.client("dynamodb", endpoint_url=moto_endpoint), os.environ["NDSTORE_DYNAMODB_TABLE"]
    for page in db.get_paginator("scan").paginate(TableName=table):
        for item in page["Items"]:
            db.delete_item(TableName=table, Key={"volume": item["volume"], "morton": item["morton"]})


def test_a_lost_index_is_found_at_start_refused_for_listing_and_rebuilt_by_reindex(
        admin: APIClient, moto_endpoint: str) -> None:
    from ndstore.api.lookups import channel_volume
    from ndstore.api.models import Channel
    from ndstore.ops.cli import commands

    make_dataset(admin, "ix", frame=(1100, 700, 16), levels=2, channels={"img8": "uint8", "ann": "uint64"})
    image = np.random.default_rng(4).integers(1, 255, (16, 700, 1100), np.uint8)
    assert admin.post("/v1/direct/cutout/ix/e1/img8/0/0:1100/0:700/0:16/", image.tobytes(),
                      content_type=OCTET).status_code == 201
    labels = np.zeros((8, 200, 300), np.uint64)
    labels[3:5, 100:150, 100:200] = 7
    assert admin.post("/v1/direct/cutout/ix/e1/ann/0/800:1100/500:700/0:8/", labels.tobytes(),
                      content_type=OCTET).status_code == 201
    image_prefix = channel_volume(Channel.objects.get(name="img8")).name_prefix
    ann_prefix = channel_volume(Channel.objects.get(name="ann")).name_prefix
    stored = stored_keys_of(image_prefix)
    assert len(stored) == 6 and stored_keys_of(ann_prefix)

    empty_the_index(moto_endpoint)
    said = io.StringIO()
    call_command("ndstore_prepare", stderr=said, stdout=io.StringIO())  # the next start
    assert "INDEX STALE" in said.getvalue()

    bbox = "/v1/boundingbox/ix/e1/ann/0/7/?type=tight"
    # a label channel's boundingbox answers from its label index, not from the lost one
    assert admin.get(bbox).json() == {"x_range": [900, 1000], "y_range": [600, 650], "z_range": [3, 5],
                                      "t_range": [0, 1]}
    for refused in (admin.post("/v1/downsample/ix/e1/img8/"),
                    admin.delete("/v1/collection/ix/experiment/e1/channel/img8/")):
        assert refused.status_code == 503, refused.content
        assert "ndstore reindex" in refused.json()["message"]
    assert stored_keys_of(image_prefix) == stored  # nothing deleted by the refused delete
    r = admin.get("/v1/cutout/ix/e1/img8/0/0:1100/0:700/0:16/", HTTP_ACCEPT=OCTET)
    assert r.status_code == 200 and np.array_equal(np.frombuffer(r.content, np.uint8).reshape(image.shape), image)

    done = CliRunner().invoke(commands, ["reindex"])
    assert done.exit_code == 0, done.output
    assert f"indexed {len(stored) + len(stored_keys_of(ann_prefix))} stored supercuboids" in done.output

    assert admin.get(bbox).json() == {"x_range": [900, 1000], "y_range": [600, 650], "z_range": [3, 5],
                                      "t_range": [0, 1]}
    assert admin.post("/v1/downsample/ix/e1/img8/").status_code == 201
    run_queues(lambda: admin.get("/v1/downsample/ix/e1/img8/").json()["status"] != "IN_PROGRESS")
    level1 = admin.get("/v1/cutout/ix/e1/img8/1/0:550/0:350/0:16/", HTTP_ACCEPT=OCTET)
    assert level1.status_code == 200 and np.frombuffer(level1.content, np.uint8).all()  # built, not empty
    assert admin.delete("/v1/collection/ix/experiment/e1/channel/img8/").status_code == 204
    assert stored_keys_of(image_prefix) == []  # private data deleted
