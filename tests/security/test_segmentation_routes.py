"""`/v1/segmentation/{c}/{e}/{ch}/` as an attacker meets it: a private channel's product status is
not told to the anonymous or to a user without a grant; only an admin of the channel may queue a
whole channel's rebuild (it costs the service a mesh and a skeleton of every supercuboid); ids
that are not labels are refused with a message, never parsed into a 500; the route refuses the
methods it does not have."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from rest_framework.test import APIClient

from tests.api.conftest import client_for, make_dataset

OCTET = "application/octet-stream"
ROUTE = "/v1/segmentation/sg/e1/ann64/"


@pytest.fixture
def labelled(admin: APIClient) -> APIClient:
    make_dataset(admin, "sg", frame=(600, 600, 16), levels=2, channels={"ann64": "uint64", "img8": "uint8"})
    data = np.full((2, 3, 4), 7, np.uint64)
    r = admin.post("/v1/direct/cutout/sg/e1/ann64/0/10:14/20:23/5:7/", data.tobytes(), content_type=OCTET)
    assert r.status_code == 201, r.content
    return admin


@pytest.mark.parametrize("who", ["anonymous", "no grant"])
def test_a_private_channels_products_are_not_told(labelled: APIClient, grant: Any, who: str) -> None:
    client = client_for(None) if who == "anonymous" else grant("stranger", "sg", None)
    expected = 401 if who == "anonymous" else 403
    for r in (client.get(ROUTE), client.get(f"{ROUTE}?segment=7"), client.post(ROUTE)):
        assert r.status_code == expected, r.content
        assert "stale" not in r.content.decode()


@pytest.mark.parametrize("level", ["read", "write"])
def test_only_an_admin_may_rebuild_a_whole_channel(labelled: APIClient, grant: Any, level: str) -> None:
    client = grant(f"{level}er", "sg", level)
    before = client.get(ROUTE)
    assert before.status_code == 200 and before.json()["stale"] == 1  # the write's own supercuboid
    r = client.post(ROUTE)
    assert r.status_code == 403, r.content
    assert labelled.get(ROUTE).json()["stale"] == 1


@pytest.mark.parametrize("raw", ["0", "-1", "18446744073709551616", "1e3", "0x10", "٣", "7 ", "", "9" * 400])
def test_segment_ids_that_are_not_labels_are_refused(labelled: APIClient, raw: str) -> None:
    r = labelled.get(ROUTE, {"segment": raw})
    assert r.status_code == 400, (raw, r.content)
    assert "segment id" in r.json()["message"] and len(r.content) < 1000


def test_an_image_channel_has_no_products(labelled: APIClient) -> None:
    for r in (labelled.get("/v1/segmentation/sg/e1/img8/"), labelled.post("/v1/segmentation/sg/e1/img8/")):
        assert r.status_code == 400 and "image channel" in r.json()["message"], r.content


@pytest.mark.parametrize("method", ["put", "patch", "delete"])
def test_methods_it_does_not_have_are_refused(labelled: APIClient, method: str) -> None:
    r = getattr(labelled, method)(ROUTE)
    assert r.status_code == 405 and r["Content-Type"] == "application/json", r.content
