"""Attackers against the mesh files of a label channel (/precomputed/.../mesh/..., and the sharded
ones): a private channel's meshes need the token and a read grant, by any path, Range or ETag
guess; ids are base-10 in 1 .. 2^64 - 1 and nothing else reaches a store; the files are
read-only (405 JSON for every write method, the body unread); hostile stored objects are refused
as corrupt, not decoded."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from tests.api.conftest import Dataset
from tests.api.test_meshes import FRAME, TOP, VOXEL, blob_labels, write_and_mesh
from tests.api.test_precomputed import make_frame_dataset
from tests.security.conftest import CountingBody, token_for, wsgi

SHARD = "0000.shard"  # 2^64 - 1's shard is ffff; 2^63's is 0000


@pytest.fixture
def secret(admin: APIClient) -> Dataset:
    ds = make_frame_dataset(admin, "hid", lo=FRAME.lo, hi=FRAME.hi, voxel=VOXEL, unit="nanometers",
                            method="anisotropic", levels=1, channels={"ann64": "uint64"})
    write_and_mesh(admin, ds, "ann64", blob_labels())
    return ds


def paths() -> list[str]:
    return ["/precomputed/hid/e1/ann64/mesh/info", f"/precomputed/hid/e1/ann64/mesh/{TOP}.index",
            f"/precomputed/hid/e1/ann64/mesh/{TOP}", "/precomputed-sharded/hid/e1/ann64/mesh/info",
            f"/precomputed-sharded/hid/e1/ann64/mesh/{SHARD}"]


def test_a_private_channels_meshes_need_the_token_and_a_grant(admin: APIClient, secret: Dataset,
                                                              grant: Any) -> None:
    stranger = grant("stranger", "hid", None)
    reader = grant("reader", "hid", "read")
    for path in paths():
        assert admin.get(path).status_code == 200, path
        assert reader.get(path).status_code == 200, path
        for who, want in ((APIClient(), 401), (stranger, 403)):
            for headers in ({}, {"HTTP_RANGE": "bytes=0-15"}, {"HTTP_IF_NONE_MATCH": "*"}):
                r = who.get(path, **headers)
                assert r.status_code == want, (path, headers, r.status_code)
                assert "ETag" not in r and "Content-Range" not in r
                assert r["Content-Type"].startswith("application/json")


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_mesh_files_are_read_only(secret: Dataset, method: str) -> None:
    _, token = token_for("root2", is_superuser=True, is_staff=True)
    for path in paths():
        body = CountingBody(8 << 20)
        answer = wsgi(method, path, body, token=token, content_type="application/octet-stream")
        assert answer.status == 405, (method, path, answer.status)
        assert answer.body.startswith(b"{") and answer.read_when_answered == 0


@pytest.mark.parametrize(("tail", "status"), [
    ("0", 400), ("0.index", 400), (str(2**64), 400), (str(2**64) + ".index", 400), ("9" * 21, 400),
    ("9" * 400, 400), ("-1", 400), ("+5", 400), ("1e3", 400), ("0x5", 400), ("\u0665", 400), (" 5", 400),
    ("5%00", 400), ("5:0", 400), ("..", 400), ("%2e%2e", 400), ("..%2finfo", 404), ("..%2f..%2f..%2finfo", 404),
    ("5/..", 404), ("5;x", 400), (str(2**64 - 2), 404), ("123456789", 404),
])
def test_bad_and_huge_ids_are_refused_before_any_read(admin: APIClient, secret: Dataset, tail: str, status: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from ndstore.engine.segments.fragments import Fragments

    reads: list[Any] = []
    real = Fragments.of_label
    monkeypatch.setattr(Fragments, "of_label", lambda self, *a: reads.append(a) or real(self, *a))
    r = admin.get(f"/precomputed/hid/e1/ann64/mesh/{tail}")
    assert r.status_code == status, (tail, r.status_code, r.content[:200])
    assert r["Content-Type"].startswith("application/json")
    if status == 400:
        assert reads == [] and ("segment id" in r.json()["message"])


def test_a_shard_name_is_exactly_four_hex_digits(admin: APIClient, secret: Dataset) -> None:
    for name in ("ffff.shard", "0000.shard"):
        assert admin.get(f"/precomputed-sharded/hid/e1/ann64/mesh/{name}").status_code == 200
    for name in ("FFFF.shard", "10000.shard", "fff.shard", "ffff", "ffff.shard.shard", "-001.shard", "%2e%2e.shard"):
        r = admin.get(f"/precomputed-sharded/hid/e1/ann64/mesh/{name}")
        assert r.status_code == 404, (name, r.status_code)


def test_a_hostile_fragment_object_is_a_500_not_decoded(admin: APIClient, secret: Dataset) -> None:
    """An object that is not what mesh_fragment wrote (a pickle, a forged header) is refused as
    corrupt: nothing in it is unpickled or trusted for a length."""
    import pickle

    from ndstore.api import lookups
    from ndstore.api.models import Channel
    from ndstore.wiring import services

    chan = Channel.objects.get(name="ann64", experiment__collection__name="hid")
    key = lookups.channel_volume(chan).volume_key(0, chan.default_time_sample)
    holding = services().fragments.holding(key, TOP)
    for blob in (pickle.dumps({"a": 1}), b"NDMESH1\n" + (10**9).to_bytes(4, "little"),
                 b"NDMESH1\n" + (60).to_bytes(4, "little") + b'{"version": 1, "cell": [512, 512, 8], "num_lods": 3, '
                 b'"pieces": 99999999}'):
        for sc in holding:
            services().fragments.put("mesh", sc, blob)
        r = admin.get(f"/precomputed/hid/e1/ann64/mesh/{TOP}.index")
        assert r.status_code == 500 and r["Content-Type"].startswith("application/json"), r.status_code
