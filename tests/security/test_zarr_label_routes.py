"""`/zarr/.../{image}/labels/{label}/...` serves another channel under an image's path, as an
attacker meets it: only an annotation channel of the same experiment that names the image a
source, only to a caller who may read both, and no spelling reaches a channel elsewhere."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from tests.api.conftest import client_for, make_dataset


@pytest.fixture
def two_experiments(admin: APIClient) -> None:
    for coll in ("la", "lb"):
        make_dataset(admin, name=coll, frame=(64, 64, 8), levels=1, channels={"img8": "uint8"})
        r = admin.post(f"/v1/collection/{coll}/experiment/e1/channel/seg/",
                       {"type": "annotation", "datatype": "uint64", "sources": ["img8"]}, format="json")
        assert r.status_code == 201, r.content
    r = admin.post("/v1/collection/la/experiment/e1/channel/img2/",
                   {"type": "image", "datatype": "uint8", "sources": ["img8"]}, format="json")
    assert r.status_code == 201, r.content
    assert admin.put("/v1/collection/la/", {"public": True}, format="json").status_code == 200


@pytest.mark.parametrize("path", [
    "labels/img2/zarr.json",  # an image channel naming the image a source is no label
    "labels/..%2F..%2Flb%2Fe1%2Fseg/zarr.json", "labels/%2E%2E/zarr.json", "labels//zarr.json",
    "labels/seg/../../../lb/e1/seg/zarr.json",
])
def test_no_spelling_serves_anything_but_a_label_of_this_image(two_experiments: None, path: str) -> None:
    r = APIClient().get(f"/zarr/la/e1/img8/{path}")
    assert r.status_code in (400, 404), (path, r.status_code, r.content)


def test_a_public_image_does_not_open_a_private_experiments_label(admin: APIClient, two_experiments: None) -> None:
    assert APIClient().get("/zarr/la/e1/img8/labels/seg/zarr.json").status_code == 200  # public: both readable
    assert APIClient().get("/zarr/lb/e1/img8/labels/seg/zarr.json").status_code == 401
    stranger = client_for(User.objects.create(username="stranger"))
    assert stranger.get("/zarr/lb/e1/img8/labels/zarr.json").status_code == 403
    assert stranger.get("/zarr/lb/e1/img8/labels/seg/0/c/0/0/0/0").status_code == 403
