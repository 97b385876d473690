"""Only levels that hold data are advertised (ndstore.api.levels): a declared level that was never
built reads as black, and a viewer zoomed out on it shows nothing."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from django.contrib.auth.models import User

from ndstore.api import demo
from tests.api.conftest import make_dataset


def scale_keys(client: Any, path: str) -> list[str]:
    r = client.get(path)
    assert r.status_code == 200, r.content
    return [s["key"] for s in json.loads(r.content)["scales"]]


def test_a_level_is_advertised_from_the_first_write_to_it(admin: Any, grant: Any) -> None:
    make_dataset(admin, "lv", frame=(512, 512, 16), levels=4)
    info = "/precomputed/lv/e1/img8/info"
    assert scale_keys(admin, info) == ["0"]
    assert admin.get("/v1/downsample/lv/e1/img8/").json()["built_levels"] == [0]

    reader = grant("reader", "lv", "read")
    refused = [
        reader.generic("POST", "/v1/cutout/lv/e1/img8/2/0:4/0:4/0:1/", b"\x01" * 16,
                       content_type="application/octet-stream"),  # no write permission
        admin.generic("POST", "/v1/cutout/lv/e1/img8/2/0:4/0:4/0:1/", b"\x01" * 15,
                      content_type="application/octet-stream"),  # a body one voxel short
    ]
    assert [r.status_code for r in refused] == [403, 400]
    assert scale_keys(admin, info) == ["0"]  # a refused write builds nothing

    r = admin.generic("POST", "/v1/cutout/lv/e1/img8/2/0:4/0:4/0:1/", b"\x01" * 16,
                      content_type="application/octet-stream")
    assert r.status_code == 201
    assert scale_keys(admin, info) == ["0", "2"]  # at once, on the next request
    assert admin.get("/v1/downsample/lv/e1/img8/").json()["built_levels"] == [0, 2]
    blaze = admin.generic("POST", "/v1/blaze/cutout/lv/e1/img8/3/0:4/0:4/0:1/", b"\x01" * 16,
                          content_type="application/octet-stream")
    assert blaze.status_code == 201
    assert scale_keys(admin, info) == ["0", "2", "3"]


def test_the_demo_builds_every_level_so_a_zoomed_out_view_shows_data(db: Any, admin: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo, "DEMO_SHAPE_XYZ", (512, 512, 32))  # the same build, smaller
    owner = User.objects.create(username="demo-owner", is_staff=True)
    assert demo.create_demo(owner)
    status = admin.get("/v1/downsample/demo/em/image/").json()
    assert status["status"] == "DOWNSAMPLED" and status["built_levels"] == [0, 1, 2, 3]
    for channel in ("image", "labels"):
        assert scale_keys(admin, f"/precomputed/demo/em/{channel}/info") == ["0", "1", "2", "3"]
    base = admin.get("/v1/cutout/demo/em/image/0/0:512/0:512/0:32/", HTTP_ACCEPT="application/octet-stream")
    top = admin.get("/precomputed/demo/em/image/3/0-64_0-64_0-32")
    assert base.status_code == 200 and top.status_code == 200
    level0 = np.frombuffer(base.content, np.uint8)
    level3 = np.frombuffer(top.content, np.uint8)
    assert level3.any() and abs(float(level3.mean()) - float(level0.mean())) < 2.0  # means of means
    labels = admin.get("/precomputed/demo/em/labels/raw/3/0-64_0-64_0-32")
    assert np.frombuffer(labels.content, "<u8").any()


def test_a_whole_channel_save_does_not_undo_a_level_another_worker_marked(admin: Any) -> None:
    """The record of built levels lives next to the voxels (ndstore/engine/levels.py), not in the
    channel's row: a save of a row loaded before another worker's write cannot undo its mark,
    and the legacy bits of the row still count."""
    from ndstore.api import levels, lookups
    from ndstore.api.models import Channel
    from ndstore.wiring import services

    make_dataset(admin, "race", levels=4)
    stale = Channel.objects.get(name="img8", experiment__collection__name="race")  # loaded before the write
    services().plane.levels.note_written(lookups.channel_volume(stale), 2)
    stale.description = "renamed"
    stale.save()
    fresh = Channel.objects.get(pk=stale.pk)
    assert fresh.description == "renamed" and levels.built_levels(fresh, lookups.channel_volume(fresh)) == [0, 2]
    r = admin.put("/v1/collection/race/experiment/e1/channel/img8/", {"description": "again"}, format="json")
    assert r.status_code == 200
    Channel.objects.filter(pk=stale.pk).update(written_levels=0b1001)  # marked before the record moved
    fresh = Channel.objects.get(pk=stale.pk)
    assert levels.built_levels(fresh, lookups.channel_volume(fresh)) == [0, 2, 3]
