"""The permission matrix: every role against every kind of endpoint (resources, cutouts on each
tier, slice images, precomputed, downsampling, NDBlaze, metadata, grants, the audit log), and
bad tokens."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from ndstore.api.models import ApiToken
from tests.api.conftest import Dataset, client_for, make_dataset

ROLES = ["anonymous", "no_grant", "read", "write", "admin", "other_admin", "staff_no_grant"]
# action -> the roles allowed to do it
MATRIX = {
    "read_cutout": {"read", "write", "admin"},
    "write_cutout": {"write", "admin"},
    "read_channel": {"read", "write", "admin"},
    "update_collection": {"admin"},
    "create_experiment": {"admin"},
    "grant": {"admin"},
    "create_collection": {"staff_no_grant"},
    "read_direct": {"read", "write", "admin"},
    "write_direct": {"write", "admin"},
    "write_blaze": {"write", "admin"},
    "read_blaze": {"read", "write", "admin"},
    "read_image": {"read", "write", "admin"},
    "read_precomputed": {"read", "write", "admin"},
    "downsample_status": {"read", "write", "admin"},
    "create_channel": {"admin"},
    "delete_channel": {"admin"},
    "create_coord_frame": {"staff_no_grant"},
    "list_collections": set(ROLES),  # each sees only what it may read (public ones, anonymously)
    "write_meta": {"write", "admin"},
    "read_meta": {"read", "write", "admin"},
    "start_blaze_merge": {"staff_no_grant"},
    "read_audit_log": set(),  # superusers only
}
BOX = ((0, 16), (0, 16), (0, 2))


@pytest.fixture
def world(admin: APIClient) -> dict[str, Any]:
    ds = make_dataset(admin, name="secret")
    make_dataset(admin, name="other")
    clients: dict[str, APIClient] = {"anonymous": APIClient()}
    for role in ROLES[1:]:
        user = User.objects.create(username=role, is_staff=role == "staff_no_grant")
        clients[role] = client_for(user)
        if role in ("read", "write", "admin"):
            admin.post("/v1/permissions/", {"user": role, "collection": "secret", "level": role}, format="json")
        if role == "other_admin":
            admin.post("/v1/permissions/", {"user": role, "collection": "other", "level": "admin"}, format="json")
    return {"ds": ds, "clients": clients, "admin": admin}


def act(action: str, client: APIClient, ds: Dataset, n: int, admin: APIClient | None = None) -> Any:
    url = ds.cutout("img8", 0, *BOX)
    body = np.full((2, 16, 16), n, np.uint8).tobytes()
    simple = {
        "read_direct": lambda: client.get(ds.cutout("img8", 0, *BOX, direct=True)),
        "write_direct": lambda: client.generic("POST", ds.cutout("img8", 0, *BOX, direct=True), body,
                                               content_type="application/octet-stream"),
        "write_blaze": lambda: client.generic("POST", url.replace("/v1/cutout/", "/v1/blaze/cutout/"), body,
                                              content_type="application/octet-stream"),
        "read_blaze": lambda: client.get(url.replace("/v1/cutout/", "/v1/blaze/cutout/")),
        "read_image": lambda: client.get("/v1/image/secret/e1/img8/xy/0/0:64/0:64/0/"),
        "read_precomputed": lambda: client.get("/precomputed/secret/e1/img8/info"),
        "downsample_status": lambda: client.get("/v1/downsample/secret/e1/img8/"),
        "create_channel": lambda: client.post(f"/v1/collection/secret/experiment/e1/channel/c{n}/",
                                              {"datatype": "uint8"}, format="json"),
        "create_coord_frame": lambda: client.post(f"/v1/coord/f{n}/", {"x_stop": 8, "y_stop": 8, "z_stop": 8},
                                                  format="json"),
        "list_collections": lambda: client.get("/v1/collection/"),
        "write_meta": lambda: client.post(f"/v1/meta/secret/?key=k{n}&value=v"),
        "read_meta": lambda: client.get("/v1/meta/secret/"),
        "start_blaze_merge": lambda: client.post("/v1/blaze/merge/"),
        "read_audit_log": lambda: client.get("/v1/audit/"),
    }
    if action in simple:
        return simple[action]()
    if action == "delete_channel":
        assert admin is not None
        made = admin.post(f"/v1/collection/secret/experiment/e1/channel/d{n}/", {"datatype": "uint8"}, format="json")
        assert made.status_code == 201, made.content
        return client.delete(f"/v1/collection/secret/experiment/e1/channel/d{n}/")
    if action == "read_cutout":
        return client.get(url)
    if action == "write_cutout":
        return client.generic("POST", url, np.full((2, 16, 16), n, np.uint8).tobytes(),
                              content_type="application/octet-stream")
    if action == "read_channel":
        return client.get("/v1/collection/secret/experiment/e1/channel/img8/")
    if action == "update_collection":
        return client.put("/v1/collection/secret/", {"description": f"v{n}"}, format="json")
    if action == "create_experiment":
        return client.post(f"/v1/collection/secret/experiment/x{n}/", {"coord_frame": "secret_frame"}, format="json")
    if action == "grant":
        return client.post("/v1/permissions/", {"user": "no_grant", "collection": "secret", "level": "read"},
                           format="json")
    if action == "create_collection":
        return client.post(f"/v1/collection/new{n}/", {}, format="json")
    raise AssertionError(action)


@pytest.mark.parametrize("action", sorted(MATRIX))
def test_permission_matrix(world: dict[str, Any], action: str) -> None:
    for n, role in enumerate(ROLES, start=1):
        if action == "grant" and role == "admin":
            continue  # checked below, after the denials, so no_grant stays ungranted
        r = act(action, world["clients"][role], world["ds"], n, world["admin"])
        if role in MATRIX[action]:
            assert r.status_code in (200, 201, 202, 204), (role, action, r.status_code, r.content)
        else:
            expected = 401 if role == "anonymous" else 403
            assert r.status_code == expected, (role, action, r.status_code, r.content)
            assert any(w in r.json()["message"] for w in ("permission", "token", "resource managers", "superusers"))
    if action == "grant":
        assert act(action, world["clients"]["admin"], world["ds"], 0).status_code == 201


def test_denied_write_leaves_data_unchanged(world: dict[str, Any]) -> None:
    ds, clients = world["ds"], world["clients"]
    assert act("write_cutout", clients["write"], ds, 5).status_code == 201
    for role in ("anonymous", "no_grant", "read", "other_admin"):
        assert act("write_cutout", clients[role], ds, 99).status_code in (401, 403)
    r = clients["read"].get(ds.cutout("img8", 0, *BOX), HTTP_ACCEPT="application/octet-stream")
    assert set(np.frombuffer(r.content, np.uint8)) == {5}


def test_public_collection_allows_anonymous_reads_only(world: dict[str, Any]) -> None:
    admin, ds, anon = world["admin"], world["ds"], world["clients"]["anonymous"]
    assert admin.put("/v1/collection/secret/", {"public": True}, format="json").status_code == 200
    assert anon.get(ds.cutout("img8", 0, *BOX)).status_code == 200
    assert anon.get("/v1/collection/secret/").status_code == 200
    assert act("write_cutout", anon, ds, 1).status_code == 401
    assert anon.get("/v1/collection/").json() == {"collections": ["secret"]}


def test_channel_grant_does_not_leak_to_siblings(world: dict[str, Any]) -> None:
    admin = world["admin"]
    admin.post("/v1/collection/secret/experiment/e1/channel/img2/", {"datatype": "uint8"}, format="json")
    admin.post("/v1/permissions/", {"user": "no_grant", "collection": "secret", "experiment": "e1",
                                    "channel": "img2", "level": "write"}, format="json")
    c = world["clients"]["no_grant"]
    assert c.get("/v1/cutout/secret/e1/img2/0/0:4/0:4/0:1/").status_code == 200
    assert c.get("/v1/cutout/secret/e1/img8/0/0:4/0:4/0:1/").status_code == 403


def test_revoking_a_grant(world: dict[str, Any]) -> None:
    admin, c = world["admin"], world["clients"]["read"]
    listed = admin.get("/v1/permissions/?collection=secret").json()["permissions"]
    assert {"user": "read", "level": "read"} in listed
    assert admin.delete("/v1/permissions/?collection=secret&user=read").status_code == 204
    assert c.get(world["ds"].cutout("img8", 0, *BOX)).status_code == 403


@pytest.mark.parametrize("header,message", [
    ("Token nope", "invalid or revoked"), ("Bearer abc", "invalid or revoked"), ("Token", "must be 'Token"),
    ("Bearer", "must be 'Token"), ("Digest abc", "must be 'Token <key>', 'Bearer <key>', or Basic"),
    (f"Basic {base64.b64encode(b'user:nope').decode()}", "invalid or revoked"),
    (f"Basic {base64.b64encode(b'user-only').decode()}", "no password"),
    (f"Basic {base64.b64encode(b'user:').decode()}", "no password"),
    ("Basic not*base64", "not base64"), (f"Basic {base64.b64encode(bytes([0xff, 0x3a, 0x61])).decode()}", "not base64"),
])
def test_bad_tokens_are_401(world: dict[str, Any], header: str, message: str) -> None:
    r = APIClient().get("/v1/collection/", HTTP_AUTHORIZATION=header)
    assert r.status_code == 401 and message in r.json()["message"], r.content
    assert r["WWW-Authenticate"] == "Token"  # never Basic: a browser would open its login dialog over a viewer


def test_a_token_is_accepted_as_bearer_and_as_the_basic_password(world: dict[str, Any]) -> None:
    """Bearer for OAuth-style tools, Basic with any user name for CloudVolume's `secrets`: the
    same token, the same grants, on reads and writes alike."""
    user = User.objects.get(username="write")
    key = ApiToken.mint(user)[1]
    ds, box = world["ds"], ((0, 4), (0, 4), (0, 1))
    for header in (f"Bearer {key}", f"bearer  {key}",
                   f"Basic {base64.b64encode(f'anyone:{key}'.encode()).decode()}"):
        c = APIClient()
        c.credentials(HTTP_AUTHORIZATION=header)
        r = c.generic("POST", ds.cutout("img8", 0, *box), np.full((1, 4, 4), 9, np.uint8).tobytes(),
                      content_type="application/octet-stream")
        assert r.status_code == 201, (header, r.content)
        got = c.get(ds.cutout("img8", 0, *box), HTTP_ACCEPT="application/octet-stream")
        assert got.status_code == 200 and got.content == bytes([9] * 16), header
        assert c.get("/v1/cutout/other/e1/img8/0/0:4/0:4/0:1/").status_code == 403  # no grant there


def test_tokens_are_stored_hashed(admin: APIClient) -> None:
    from ndstore.api.models import ApiToken

    user = User.objects.create(username="h")
    token, key = ApiToken.mint(user)
    assert key not in token.key_hash and len(token.key_hash) == 64
