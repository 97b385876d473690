"""The skeleton routes as an attacker meets them: a private channel's skeletons need a token
with a grant (the same check as its chunks), segment ids that are not a decimal uint64 above 0
are a JSON 400 (never a 500 from an overflow), a label past the dtype's range or never written
is a 404, writes are a JSON 405, paths that try to climb out or to name other files are a 404,
and a damaged fragment object is a 500 that names it, never a crash or a wrong skeleton."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from rest_framework.test import APIClient

from ndstore.core.segments import skeleton as sk
from tests.api.conftest import client_for, make_dataset
from tests.api.test_skeletons import FRAME, NM, TUBE, build_fragments, volume

OCTET = "application/octet-stream"
BASE = "/precomputed/px/e1/ann/skeletons"
SHARDED = "/precomputed-sharded/px/e1/ann/skeletons"


@pytest.fixture
def channel(admin: APIClient) -> APIClient:
    """A private collection with a label channel (no voxels yet)."""
    make_dataset(admin, "px", frame=FRAME, levels=1, channels={"ann": "uint64"},
                 frame_fields={"x_voxel_size": NM[0], "y_voxel_size": NM[1], "z_voxel_size": NM[2],
                               "voxel_unit": "nanometers"})
    return admin


@pytest.fixture
def private(channel: APIClient) -> APIClient:
    """The same with labels written and their skeleton fragments built."""
    vol = volume()
    r = channel.generic("POST", f"/v1/direct/cutout/px/e1/ann/0/0:{FRAME[0]}/0:{FRAME[1]}/0:{FRAME[2]}/",
                        vol.tobytes(), content_type=OCTET)
    assert r.status_code == 201, r.content
    build_fragments("ann", vol)
    return channel


def paths() -> list[str]:
    shard = sk.SHARDS.shard_name(sk.shard_of(TUBE))
    return [f"{BASE}/info", f"{BASE}/{TUBE}", f"{SHARDED}/info", f"{SHARDED}/{shard}"]


def test_the_owner_reads_them_all(private: APIClient) -> None:
    for path in paths():
        r = private.get(path)
        assert r.status_code == 200 and r["Access-Control-Allow-Origin"] == "*", path
        assert r["Cache-Control"].startswith("private"), path  # a private channel's file is never shared


@pytest.mark.parametrize("who", ["anonymous", "no grant", "bad token"])
def test_a_private_channels_skeletons_need_a_grant(private: APIClient, grant: Any, who: str) -> None:
    if who == "anonymous":
        client, expected = client_for(None), 401
    elif who == "no grant":
        client, expected = grant("stranger", "px", None), 403
    else:
        client, expected = APIClient(), 401
        client.credentials(HTTP_AUTHORIZATION="Token " + "0" * 40)
    for path in [*paths(), f"{BASE}/12345", f"{BASE}/abc"]:
        r = client.get(path)
        assert r.status_code == expected and r["Content-Type"] == "application/json", (path, r.content)
        assert b"neuroglancer" not in r.content and str(TUBE).encode() not in r.content


def test_a_read_grant_is_enough(private: APIClient, grant: Any) -> None:
    reader = grant("reader", "px", "read")
    for path in paths():
        assert reader.get(path).status_code == 200, path


@pytest.mark.parametrize("segment", ["0", "00", "007", "-5", "+5", "1e3", "0x10", "abc", str(2**64), str(10**40),
                                     "1" * 100, "\u0663", "\u00b9", "5.0", "%20", "18446744073709551616"])
def test_bad_segment_ids_are_a_json_400(channel: APIClient, segment: str) -> None:
    r = channel.get(f"{BASE}/{segment}")
    assert r.status_code == 400 and r["Content-Type"] == "application/json", (segment, r.content)
    assert "segment id" in r.json()["message"]


@pytest.mark.parametrize("segment", [1, 12345, 2**64 - 2, 2**63])
def test_labels_with_no_skeleton_are_a_404(private: APIClient, segment: int) -> None:
    r = private.get(f"{BASE}/{segment}")
    assert r.status_code == 404 and "no skeleton" in r.json()["message"], r.content


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
def test_writes_are_a_json_405(channel: APIClient, method: str) -> None:
    for path in paths():
        r = getattr(channel, method)(path, b"\0" * 16, content_type=OCTET)
        assert r.status_code == 405 and r["Content-Type"] == "application/json", (method, path, r.content)


@pytest.mark.parametrize("path", [
    f"{BASE}/../info", f"{BASE}/../../ann/info/../skeletons/5", f"{BASE}/%2e%2e/info", f"{BASE}/5/",
    f"{BASE}/5/extra", f"{BASE}/info/5", f"{SHARDED}/0005", f"{SHARDED}/05.shard", f"{SHARDED}/10000.shard",
    f"{SHARDED}/000G.shard", f"{SHARDED}/0005.shard.bak", f"{SHARDED}/{TUBE}", f"{BASE}/5.shard",
    "/precomputed/px/e1/ann/skeletons", "/precomputed/px/e1/ann/skeletons/",
])
def test_path_tricks_are_a_json_404_or_400(channel: APIClient, path: str) -> None:
    r = channel.get(path)
    assert r.status_code in (400, 404) and r["Content-Type"] == "application/json", (path, r.status_code, r.content)


def test_a_damaged_fragment_is_a_500_that_says_so(private: APIClient) -> None:
    from ndstore.api import lookups
    from ndstore.api.models import Channel
    from ndstore.wiring import services

    key = lookups.channel_volume(Channel.objects.get(name="ann")).volume_key(0, 0)
    services().fragments.put("skeleton", key.supercuboid(0), b"\xff\xff\x00\x00" + b"[" * 100)
    r = private.get(f"{BASE}/{TUBE}")
    assert r.status_code == 500 and r["Content-Type"] == "application/json", r.content
    assert "skeleton fragment" in r.json()["message"]


def test_an_image_channel_has_no_skeletons(admin: APIClient) -> None:
    make_dataset(admin, "im", frame=(64, 64, 8), levels=1, channels={"img": "uint8"})
    for path in ("/precomputed/im/e1/img/skeletons/info", "/precomputed/im/e1/img/skeletons/5",
                 "/precomputed-sharded/im/e1/img/skeletons/0005.shard"):
        r = admin.get(path)
        assert r.status_code == 404 and "label" in r.json()["message"], path


def test_an_empty_shard_and_shard_numbers_past_the_spec(private: APIClient) -> None:
    r = private.get(f"{SHARDED}/fffe.shard")  # a shard of no label
    assert r.status_code == 200 and np.frombuffer(r.content, "<u8").tolist() == [0, 0]
    for bad in ("fffff.shard", "ffffffffffffffff.shard"):
        assert private.get(f"{SHARDED}/{bad}").status_code == 404
