"""What Neuroglancer's `boss://` source asks of a public channel before its first chunk, under
`/latest/` as it sends it: the experiment, the channel, the coordinate frame (anonymously) and
the downsample status (without a trailing slash)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tests.api.conftest import make_dataset


@pytest.fixture
def public(admin: APIClient) -> None:
    make_dataset(admin, name="bpub")
    make_dataset(admin, name="bpriv")
    assert admin.put("/v1/collection/bpub/", {"public": True}, format="json").status_code == 200


def test_a_public_channels_frame_is_read_anonymously_others_need_a_token(admin: APIClient, public: None) -> None:
    anonymous = APIClient()
    r = anonymous.get("/latest/coord/bpub_frame/")
    assert r.status_code == 200 and r.json()["x_stop"] == 1100, r.content
    assert anonymous.get("/latest/coord/bpub_frame").status_code == 200  # the Boss's slashless form
    refused = anonymous.get("/latest/coord/bpriv_frame/")
    assert refused.status_code == 401 and "no public collection uses" in refused.json()["message"]
    assert admin.get("/latest/coord/bpriv_frame/").status_code == 200
    assert anonymous.delete("/latest/coord/bpub_frame/").status_code == 401  # reading is all it opens


def test_the_downsample_status_answers_without_its_trailing_slash(admin: APIClient, public: None) -> None:
    anonymous = APIClient()
    with_slash = anonymous.get("/latest/downsample/bpub/e1/img8/")
    without = anonymous.get("/latest/downsample/bpub/e1/img8")
    assert with_slash.status_code == without.status_code == 200, without.content
    assert with_slash.json() == without.json()
    assert anonymous.get("/latest/downsample/bpriv/e1/img8").status_code == 401
