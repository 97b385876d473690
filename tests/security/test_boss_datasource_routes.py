"""The two answers opened for Neuroglancer's boss:// source, as an attacker meets them: a public
channel's coordinate frame is readable anonymously, and nothing more (no other frame, no change
of it); the downsample routes without their trailing slash check what the slashed ones check."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tests.api.conftest import client_for, make_dataset


@pytest.fixture
def frames(admin: APIClient) -> None:
    make_dataset(admin, name="spub")
    make_dataset(admin, name="spriv")
    assert admin.put("/v1/collection/spub/", {"public": True}, format="json").status_code == 200


def test_anonymous_callers_read_a_public_frame_and_change_nothing(admin: APIClient, frames: None) -> None:
    anonymous = APIClient()
    assert anonymous.get("/v1/coord/spriv_frame/").status_code == 401
    for method in ("put", "patch", "delete"):
        r = getattr(anonymous, method)("/v1/coord/spub_frame/", {"x_stop": 5}, format="json")
        assert r.status_code == 401, (method, r.content)
    assert admin.get("/v1/coord/spub_frame/").json()["x_stop"] == 1100
    assert anonymous.post("/v1/coord/spub_frame2/", {"x_stop": 5, "y_stop": 5, "z_stop": 5},
                          format="json").status_code == 401


def test_a_frame_turns_private_again_with_its_collection(admin: APIClient, frames: None) -> None:
    anonymous = APIClient()
    assert anonymous.get("/v1/coord/spub_frame/").status_code == 200
    assert admin.put("/v1/collection/spub/", {"public": False}, format="json").status_code == 200
    assert anonymous.get("/v1/coord/spub_frame/").status_code == 401  # at once: the metadata generation


@pytest.mark.django_db
def test_the_slashless_downsample_route_checks_as_the_slashed_one(admin: APIClient, frames: None) -> None:
    from django.contrib.auth.models import User

    stranger = client_for(User.objects.create(username="stranger"))
    for path in ("/v1/downsample/spriv/e1/img8", "/latest/downsample/spriv/e1/img8"):
        assert APIClient().post(path, {}, format="json").status_code == 401
        assert stranger.post(path, {}, format="json").status_code == 403
        assert stranger.get(path).status_code == 403
        assert APIClient().delete(path).status_code == 401


def test_image_cutouts_answer_nothing_before_the_caller_may_read(admin: APIClient, frames: None) -> None:
    """A private channel's refusal comes before the image's own checks (no 406 tells an anonymous
    caller its datatype), and a box no JPEG can hold is refused before a byte is read."""
    assert admin.post("/v1/collection/spriv/experiment/e1/channel/ann/", {"type": "annotation", "datatype": "uint64"},
                      format="json").status_code == 201
    for channel in ("img8", "ann"):
        r = APIClient().get(f"/v1/cutout/spriv/e1/{channel}/0/0:8/0:8/0:1/", HTTP_ACCEPT="image/jpeg")
        assert r.status_code == 401, (channel, r.content)
    tall = admin.get("/v1/cutout/spriv/e1/img8/0/0:2/0:700/0:100/", HTTP_ACCEPT="image/jpeg")  # 70,000 rows
    assert tall.status_code == 406 and "at most 65535 pixels a side" in tall.json()["message"], tall.content
    assert admin.get("/v1/cutout/spriv/e1/img8/0/0:2/0:700/0:100/", HTTP_ACCEPT="image/png").status_code == 200
