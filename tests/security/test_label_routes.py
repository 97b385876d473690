"""`ids` and `boundingbox` now answer from the label index, as an attacker meets them: ids past
every dtype's range occur nowhere (404, never a 500 from an integer overflow in numpy, SQLite or
DynamoDB), the background is refused, a private channel's labels are not told to the anonymous
or to a user without a grant, and a label index that cannot be reached is a 503, never an answer
from half an index."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from rest_framework.test import APIClient

from ndstore.core.errors import StorageError
from tests.api.conftest import client_for, make_dataset

OCTET = "application/octet-stream"
TOP = 2**64 - 1


@pytest.fixture
def labelled(admin: APIClient) -> APIClient:
    make_dataset(admin, "sx", frame=(600, 600, 16), levels=2, channels={"ann64": "uint64", "ann32": "uint32"})
    for channel, dtype, label in (("ann64", np.uint64, TOP), ("ann32", np.uint32, 2**32 - 1)):
        data = np.full((2, 3, 4), label, dtype)
        r = admin.post(f"/v1/direct/cutout/sx/e1/{channel}/0/10:14/20:23/5:7/", data.tobytes(), content_type=OCTET)
        assert r.status_code == 201, r.content
    return admin


def bbox(client: APIClient, channel: str, label: int) -> Any:
    return client.get(f"/v1/boundingbox/sx/e1/{channel}/0/{label}/?type=tight")


HERE = {"x_range": [10, 14], "y_range": [20, 23], "z_range": [5, 7], "t_range": [0, 1]}


@pytest.mark.parametrize(("channel", "label", "status"), [
    ("ann64", TOP, 200), ("ann64", TOP - 1, 404), ("ann64", 2**64, 404), ("ann64", 10**40, 404),
    ("ann64", 2**63, 404), ("ann32", 2**32 - 1, 200), ("ann32", 2**32, 404), ("ann32", TOP, 404),
    ("ann64", 0, 400), ("ann32", 0, 400),
])
def test_labels_at_and_past_the_ends_of_the_dtype(labelled: APIClient, channel: str, label: int, status: int) -> None:
    r = bbox(labelled, channel, label)
    assert r.status_code == status, r.content
    if status == 200:
        assert r.json() == HERE
    else:
        assert r["Content-Type"] == "application/json" and r.json()["message"]


def test_ids_of_the_largest_labels_are_exact_decimal_strings(labelled: APIClient) -> None:
    for channel, label in (("ann64", TOP), ("ann32", 2**32 - 1)):
        r = labelled.get(f"/v1/ids/sx/e1/{channel}/0/0:600/0:600/0:16/")
        assert r.status_code == 200 and r.json() == {"ids": [str(label)]}, r.content


@pytest.mark.parametrize("who", ["anonymous", "no grant"])
def test_a_private_channels_labels_are_not_told(labelled: APIClient, grant: Any, who: str) -> None:
    client = client_for(None) if who == "anonymous" else grant("stranger", "sx", None)
    expected = 401 if who == "anonymous" else 403
    for r in (bbox(client, "ann64", TOP), bbox(client, "ann64", 12345),
              client.get("/v1/ids/sx/e1/ann64/0/0:600/0:600/0:16/")):
        assert r.status_code == expected, r.content
        assert str(TOP) not in r.content.decode()


def test_an_unreachable_label_index_is_a_503(labelled: APIClient, monkeypatch: pytest.MonkeyPatch) -> None:
    from ndstore.wiring import services

    labels = services().labels
    assert labels is not None

    def away(*_: Any) -> Any:
        raise StorageError("the label index cannot be reached")

    monkeypatch.setattr(labels.index, "channel", away)
    for r in (bbox(labelled, "ann64", TOP), labelled.get("/v1/ids/sx/e1/ann64/0/0:600/0:600/0:16/")):
        assert r.status_code == 503 and "label index" in r.json()["message"], r.content
    monkeypatch.undo()
    assert bbox(labelled, "ann64", TOP).json() == HERE
