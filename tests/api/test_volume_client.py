"""ndstore.client.Volume against the service over real HTTP (pytest-django's live server)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from django.contrib.auth.models import User

from ndstore.api.models import ApiToken
from ndstore.client import Volume, VolumeError
from ndstore.core.geometry import Box
from tests.api.conftest import client_for, make_dataset


@pytest.fixture
def served(live_server: Any) -> tuple[str, str]:
    user = User.objects.create(username="lab", is_staff=True, is_superuser=True)
    make_dataset(client_for(user), frame=(1100, 700, 100), channels={"img8": "uint8", "ann64": "uint64"})
    _, key = ApiToken.mint(user)
    return live_server.url, key


def test_slicing_reads_and_assignment_writes_across_supercuboids(served: tuple[str, str]) -> None:
    url, token = served
    vol = Volume(url, "c1/e1/img8", token=token, parallel=4)
    assert vol.shape == (100, 700, 1100) and vol.dtype == np.uint8
    box = Box((300, 400, 50), (700, 600, 80))  # crosses supercuboid edges in x, y and z
    assert len(vol.pieces(box)) == 8
    data = np.random.default_rng(3).integers(0, 256, box.shape_zyx, np.uint8)
    vol[50:80, 400:600, 300:700] = data
    assert np.array_equal(vol[50:80, 400:600, 300:700], data)
    assert np.array_equal(vol[60, 400:600, 300:700], data[10])  # an integer drops its axis
    assert np.array_equal(vol[:, 450, 350], np.r_[np.zeros(50, np.uint8), data[:, 50, 50], np.zeros(20, np.uint8)])
    vol[0:2, 0:3, 0:4] = 7  # a scalar fills the box
    assert (Volume(url, "c1/e1/img8", token=token, tier="direct")[0:2, 0:3, 0:4] == 7).all()


def test_uint64_labels_round_trip(served: tuple[str, str]) -> None:
    url, token = served
    vol = Volume(url, "c1/e1/ann64", token=token)
    labels = np.random.default_rng(4).integers(0, 2**62, (4, 100, 600), np.uint64)
    vol[10:14, 500:600, 0:600] = labels
    assert np.array_equal(vol[10:14, 500:600, 0:600], labels)


def test_mistakes_are_named(served: tuple[str, str]) -> None:
    url, token = served
    vol = Volume(url, "c1/e1/img8", token=token)
    with pytest.raises(IndexError, match="outside"):
        vol[0:10, 0:10, 1000:1200]
    with pytest.raises(IndexError, match="step 1"):
        vol[0:10:2, 0:10, 0:10]
    with pytest.raises(ValueError, match="fit"):
        vol[0:2, 0:2, 0:2] = np.zeros((3, 2, 2), np.uint8)
    with pytest.raises(VolumeError, match="404.*does not exist"):
        Volume(url, "c1/e1/nope", token=token)
    with pytest.raises(VolumeError, match="40[13]"):
        Volume(url, "c1/e1/img8")[0:1, 0:1, 0:1]


def test_the_status_verb_reports_what_the_service_holds(served: tuple[str, str]) -> None:
    import json

    from click.testing import CliRunner

    from ndstore.cli import main

    url, token = served
    result = CliRunner().invoke(main, ["status", "--server", url, "--token", token])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["collections"] == {"collections": ["c1"]}
    assert "pending" in report["blaze"]
    down = CliRunner().invoke(main, ["status", "--server", "http://127.0.0.1:9"])
    assert down.exit_code != 0 and "does not answer" in down.output
