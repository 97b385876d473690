"""A scoped token as an attacker holds it (a share link forwarded too far, a leaked CI token): a
token scoped to one channel reads nothing else — not the channel beside it, another experiment
or collection (public ones included), the listings, the metadata, the coordinate frames of
others, the audit log or the admin routes — even when its user is a superuser; it mints nothing
wider, stronger or longer-lived than itself; it sees and revokes no token but its own. The
/v1/tokens/ bodies are bounded before they are read, and the /share/ page runs only its script,
is never framed and names no token."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from ndstore.api.json_body import MAX_DEPTH
from ndstore.api.models import ApiToken, AuditEntry, Collection, Grant
from tests.api.conftest import bearer, client_for, make_dataset
from tests.security.conftest import CountingBody, strict_page_policy, wsgi

BIG = 64 << 20
OCTET = "application/octet-stream"


@pytest.fixture
def boss(admin: APIClient) -> tuple[User, APIClient]:
    """A staff superuser, and collections `sc` (experiments e1 and e2, channels img8 and img16;
    e1 also ann64, labels of img8) and `pub` (public), each channel written."""
    for name in ("sc", "pub"):
        make_dataset(admin, name=name, frame=(64, 64, 4), levels=1, channels={"img8": "uint8", "img16": "uint16"})
    assert admin.post("/v1/collection/sc/experiment/e2/", {"coord_frame": "sc_frame", "num_hierarchy_levels": 1},
                      format="json").status_code == 201
    assert admin.post("/v1/collection/sc/experiment/e2/channel/img8/", {"datatype": "uint8"},
                      format="json").status_code == 201
    assert admin.put("/v1/collection/pub/", {"public": True}, format="json").status_code == 200
    assert admin.post("/v1/collection/sc/experiment/e1/channel/ann64/", {
        "type": "annotation", "datatype": "uint64", "sources": ["img8"]}, format="json").status_code == 201
    labels = np.zeros((4, 64, 64), np.uint64)
    labels[1:3, 8:40, 8:40] = 1
    assert admin.generic("POST", "/v1/cutout/sc/e1/ann64/0/0:64/0:64/0:4/", labels.tobytes(),
                         content_type=OCTET).status_code == 201
    for path in ("sc/e1/img8", "sc/e1/img16", "sc/e2/img8", "pub/e1/img8"):
        dtype = np.uint16 if path.endswith("16") else np.uint8
        assert admin.generic("POST", f"/v1/cutout/{path}/0/0:64/0:64/0:4/", np.full((4, 64, 64), 9, dtype).tobytes(),
                             content_type=OCTET).status_code == 201
    assert admin.post("/v1/annotations/sc/e1/syn/", {"annotation_type": "point", "segmentation": "ann64",
                                                     "relationships": ["cell"]}, format="json").status_code == 201
    assert admin.post("/v1/annotations/sc/e1/syn/annotations/", [{"id": "1", "point": [8, 8, 1],
                                                                 "relationships": {"cell": ["1"]}}],
                      format="json").status_code == 200
    user = User.objects.create(username="boss", is_staff=True, is_superuser=True)
    return user, client_for(user)


def minted(client: APIClient, **body: Any) -> Any:
    return client.post("/v1/tokens/", {"level": "read", "expires_in": 600, **body}, format="json")


@pytest.fixture
def shared(boss: tuple[User, APIClient]) -> tuple[APIClient, dict[str, Any]]:
    """A superuser's read token on sc/e1/img8."""
    r = minted(boss[1], scope="sc/e1/img8")
    assert r.status_code == 201, r.content
    return bearer(r.json()["key"]), r.json()


ELSEWHERE = [
    "/v1/cutout/sc/e1/img16/0/0:64/0:64/0:4/",  # the channel beside it
    "/v1/cutout/sc/e2/img8/0/0:64/0:64/0:4/",  # another experiment
    "/v1/cutout/pub/e1/img8/0/0:64/0:64/0:4/",  # another collection, public
    "/latest/cutout/sc/e1/img16/0/0:64/0:64/0:4/",
    "/v1/direct/cutout/sc/e2/img8/0/0:64/0:64/0:4/",
    "/precomputed/sc/e1/img16/info",
    "/precomputed/sc/e1/img16/0/0-64_0-64_0-4",
    "/precomputed-sharded/sc/e2/img8/info",
    "/zarr/sc/e1/img16/zarr.json",
    "/zarr/sc/e1/img16/0/c/0/0/0/0",
    "/v1/image/sc/e1/img16/xy/0/0:64/0:64/1/",
    "/v1/blaze/cutout/sc/e1/img16/0/0:64/0:64/0:4/",
    "/precomputed/sc/e1/ann64/mesh/info",  # the labels beside it: meshes, skeletons, properties, ids
    "/precomputed/sc/e1/ann64/mesh/1.index",
    "/precomputed-sharded/sc/e1/ann64/mesh/info",
    "/precomputed/sc/e1/ann64/skeletons/info",
    "/precomputed/sc/e1/ann64/skeletons/1",
    "/precomputed/sc/e1/ann64/segment_properties/info",
    "/zarr/sc/e1/img8/labels/ann64/zarr.json",  # a label of its own image is still another channel
    "/zarr/sc/e1/img8/labels/ann64/0/c/0/0/0/0",
    "/v1/segments/sc/e1/ann64/",
    "/v1/segments/sc/e1/ann64/1/",
    "/v1/segmentation/sc/e1/ann64/",
    "/v1/ids/sc/e1/ann64/0/0:64/0:64/0:4/",
    "/v1/boundingbox/sc/e1/ann64/0/1/",
    "/v1/reserve/sc/e1/ann64/10/",
    "/v1/annotations/sc/e1/",  # the experiment's annotation layers, and their files
    "/v1/annotations/sc/e1/syn/",
    "/precomputed-annotations/sc/e1/syn/info",
    "/precomputed-annotations/sc/e1/syn/spatial0/0_0_0",
    "/precomputed-annotations/sc/e1/syn/by_id/1",
    "/precomputed-annotations/sc/e1/syn/rel_cell/1",
    "/v1/collection/sc/",  # the collection and experiment above it
    "/v1/collection/sc/experiment/e1/",
    "/v1/collection/sc/experiment/",
    "/v1/collection/sc/experiment/e1/channel/",
    "/v1/collection/sc/experiment/e1/channel/img16/",
    "/v1/meta/sc/",
    "/v1/meta/sc/e1/",
    "/v1/meta/sc/e1/img16/",
    "/v1/downsample/sc/e1/img16/",
    "/v1/coord/sc_frame/",
    "/v1/coord/pub_frame/",
    "/v1/audit/",
    "/v1/permissions/?collection=sc",
    "/v1/blaze/merge/",
    "/metrics",
]


@pytest.mark.django_db
def test_a_token_scoped_to_one_channel_reads_nothing_else(shared: tuple[APIClient, dict[str, Any]],
                                                          boss: tuple[User, APIClient]) -> None:
    """Every route of ELSEWHERE in one test (one dataset to build, not one per route): a 403 to
    the scoped token, while its user's other token reads it."""
    reader, _ = shared
    wrong = []
    for path in ELSEWHERE:
        accept = "application/octet-stream" if "cutout" in path else "*/*"
        scoped, unscoped = reader.get(path, HTTP_ACCEPT=accept), boss[1].get(path, HTTP_ACCEPT=accept)
        if scoped.status_code != 403 or unscoped.status_code not in (200, 404):
            wrong.append((path, scoped.status_code, unscoped.status_code, scoped.content[:200]))
    assert not wrong, wrong


@pytest.mark.django_db
def test_its_listings_hold_only_its_scope(shared: tuple[APIClient, dict[str, Any]], boss: Any) -> None:
    reader, token = shared
    assert reader.get("/v1/collection/").json() == {"collections": []}  # no collection lies inside a channel
    assert reader.get("/v1/coord/").json() == {"coords": []}
    assert reader.get("/v1/ingest/").json() == {"jobs": []}
    labels = reader.get("/zarr/sc/e1/img8/labels/zarr.json")  # its image's labels: none it may read
    assert labels.status_code == 200 and labels.json()["attributes"]["ome"]["labels"] == []
    assert [t["id"] for t in reader.get("/v1/tokens/").json()["tokens"]] == [token["id"]]
    others = ApiToken.objects.exclude(pk=token["id"]).values_list("pk", flat=True)
    for pk in others:  # its user's unscoped token and the admin's: a 404, as for no token at all
        assert reader.delete(f"/v1/tokens/{pk}/").status_code == 404
    assert ApiToken.objects.filter(pk__in=list(others)).count() == len(others)
    # a collection-scoped token lists that collection and reads inside it, nothing beside it
    collection = bearer(minted(boss[1], scope="sc").json()["key"])
    assert collection.get("/v1/collection/").json() == {"collections": ["sc"]}
    assert collection.get("/v1/coord/").json() == {"coords": ["sc_frame"]}
    assert collection.get("/v1/cutout/sc/e2/img8/0/0:64/0:64/0:4/", HTTP_ACCEPT=OCTET).status_code == 200
    assert collection.get("/v1/cutout/pub/e1/img8/0/0:64/0:64/0:4/", HTTP_ACCEPT=OCTET).status_code == 403


@pytest.mark.django_db
@pytest.mark.parametrize("method, path, body", [
    ("POST", "/v1/collection/new/", {}),  # staff's
    ("POST", "/v1/coord/new_frame/", {"x_stop": 8, "y_stop": 8, "z_stop": 8}),
    ("DELETE", "/v1/collection/sc/experiment/e1/channel/img8/", None),  # admin of its own channel
    ("PUT", "/v1/collection/sc/experiment/e1/channel/img8/", {"description": "x"}),
    ("POST", "/v1/permissions/", {"user": "boss", "collection": "sc", "experiment": "e1", "channel": "img8",
                                  "level": "admin"}),
    ("POST", "/v1/downsample/sc/e1/img8/", None),
    ("POST", "/v1/blaze/merge/", None),
    ("POST", "/v1/annotations/sc/e1/syn/annotations/", [{"id": "2", "point": [1, 1, 1]}]),
    ("POST", "/v1/annotations/sc/e1/new/", {"annotation_type": "point"}),
    ("DELETE", "/v1/annotations/sc/e1/syn/", None),
    ("POST", "/v1/meta/sc/e1/img8/?key=k&value=v", None),
    ("POST", "/v1/ingest/", {"collection": "sc", "experiment": "e1", "channel": "img8", "x_start": 0, "x_stop": 64,
                             "y_start": 0, "y_stop": 64, "z_start": 0, "z_stop": 4, "tile_size_x": 64,
                             "tile_size_y": 64}),
])
def test_it_never_acts_as_staff_superuser_admin_or_writer(shared: tuple[APIClient, dict[str, Any]], method: str,
                                                         path: str, body: Any) -> None:
    reader, _ = shared
    r = reader.generic(method, path, json.dumps(body) if body is not None else "", content_type="application/json")
    assert r.status_code == 403, (path, r.content)
    assert not Collection.objects.filter(name="new").exists()
    assert Grant.objects.filter(user__username="boss").count() == 0


@pytest.mark.django_db
def test_its_user_keeps_its_own_standing_on_its_other_tokens(shared: tuple[APIClient, dict[str, Any]],
                                                             boss: tuple[User, APIClient]) -> None:
    """The scope rides on a per-request copy of the user: the cached user a scoped request saw is
    the one the next unscoped request sees, still a superuser."""
    reader, _ = shared
    for _ in range(2):
        assert reader.get("/v1/audit/").status_code == 403
        assert boss[1].get("/v1/audit/").status_code == 200
    assert User.objects.get(username="boss").is_superuser


@pytest.mark.django_db
@pytest.mark.parametrize("body, said", [
    ({"scope": "sc/e1"}, "inside that scope only"),  # wider
    ({}, "inside that scope only"),  # all the user's
    ({"scope": "sc/e1/img16"}, "inside that scope only"),  # beside it
    ({"scope": "sc/e1/img8", "level": "write"}, "limited to read"),  # stronger
    ({"scope": "sc/e1/img8", "expires_in": 3600}, "outlives it"),  # longer-lived
])
def test_it_mints_nothing_wider_stronger_or_longer_lived(shared: tuple[APIClient, dict[str, Any]],
                                                         body: dict[str, Any], said: str) -> None:
    reader, _ = shared
    before = ApiToken.objects.count()
    r = minted(reader, **body)
    assert r.status_code == 403 and said in r.json()["message"], r.content
    assert ApiToken.objects.count() == before
    narrower = minted(reader, scope="sc/e1/img8", expires_in=60)  # what it may mint
    assert narrower.status_code == 201 and narrower.json()["scope"] == "sc/e1/img8"


@pytest.mark.django_db
def test_no_token_mints_one_that_outlives_it(boss: tuple[User, APIClient]) -> None:
    """Nor an unscoped token that expires (one an operator set in the admin)."""
    caller = ApiToken.objects.get(user=boss[0])
    caller.expires = timezone.now() + timedelta(seconds=120)
    caller.save()
    r = minted(boss[1], scope="sc/e1/img8", expires_in=3600)
    assert r.status_code == 403 and "outlives it" in r.json()["message"], r.content
    assert minted(boss[1], scope="sc/e1/img8", expires_in=60).status_code == 201


@pytest.mark.django_db
def test_nobody_mints_beyond_their_own_grants(boss: Any) -> None:
    reader = User.objects.create(username="reader")
    Grant.objects.create(user=reader, collection=Collection.objects.get(name="sc"), level="read")
    client = client_for(reader)
    assert minted(client, scope="sc/e1/img8", level="write").status_code == 403
    assert minted(client, scope="pub/e1/img8").status_code == 201  # public: anyone reads it
    assert minted(client, scope="sc/e1/img8").status_code == 201
    assert APIClient().post("/v1/tokens/", {}, format="json").status_code == 401
    assert APIClient().get("/v1/tokens/").status_code == 401


@pytest.mark.django_db
@pytest.mark.parametrize("body, said", [
    ({"scope": "sc/e1/img8", "level": "admin"}, "level"),
    ({"scope": "sc/e1/img8", "level": "read"}, "expires_in"),
    ({"scope": "sc/e1/img8", "level": "read", "expires_in": 367 * 86400}, "expires_in"),
    ({"scope": "sc/e1/img8", "level": "read", "expires_in": 0}, "expires_in"),
    ({"scope": "sc/e1/img8", "level": "read", "expires_in": "60"}, None),  # DRF coerces; fine either way
    ({"scope": "../etc/passwd", "level": "read", "expires_in": 60}, "scope"),
    ({"scope": "sc/e1/img8/x", "level": "read", "expires_in": 60}, "scope"),
    ({"scope": "sc/e1/img8", "level": "read", "expires_in": 60, "label": "x" * 129}, "label"),
    ({"scope": "sc/e1", "level": "read", "expires_in": 60, "share": True}, "view"),
    ({"scope": "sc/e1", "level": "write", "expires_in": 60, "share": True}, "read-only"),
    ({"scope": "sc/e1", "level": "read", "expires_in": 60, "share": True, "view": "pub/e1/img8"}, "inside the scope"),
    ([1, 2], "JSON object"),
])
def test_bad_mint_bodies_are_a_400_naming_the_field(boss: Any, body: Any, said: str | None) -> None:
    r = boss[1].post("/v1/tokens/", body, format="json")
    if said is None:
        assert r.status_code in (201, 400)
        return
    assert r.status_code == 400 and said in json.dumps(r.json()), r.content


@pytest.mark.django_db
def test_token_bodies_are_bounded_before_they_are_read(boss: tuple[User, APIClient]) -> None:
    key = ApiToken.mint(boss[0])[1]
    for token in (None, key):
        body = CountingBody(BIG)
        answer = wsgi("POST", "/v1/tokens/", body, token=token)
        assert answer.status == (401 if token is None else 413) and answer.read_when_answered == 0, answer.body
    deep = b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)
    assert wsgi("POST", "/v1/tokens/", deep, token=key).status == 400
    twice = b'{"level": "read", "level": "write", "expires_in": 60}'
    assert "twice" in wsgi("POST", "/v1/tokens/", twice, token=key).json()["message"]


@pytest.mark.django_db
def test_minting_and_revoking_are_audited_without_the_key(boss: tuple[User, APIClient]) -> None:
    r = minted(boss[1], scope="sc/e1/img8", share=True)
    key = r.json()["key"]
    assert boss[1].delete(f"/v1/tokens/{r.json()['id']}/").status_code == 204
    rows = list(AuditEntry.objects.filter(path__startswith="/v1/tokens/").order_by("id"))
    assert [(e.method, e.status, e.target["action"]) for e in rows] == [("POST", 201, "mint"),
                                                                         ("DELETE", 204, "revoke")]
    assert rows[0].target["scope"] == "sc/e1/img8" and rows[1].target["token"] == r.json()["id"]
    assert all(key not in json.dumps([e.body, e.target, e.path]) for e in rows)


@pytest.mark.django_db
def test_the_share_page_runs_only_its_script_is_never_framed_and_holds_no_token() -> None:
    page = Client().get("/share/?token=abc")
    csp, script = strict_page_policy(page)
    assert "connect-src" not in csp and "base-uri 'none'" in csp  # it connects nowhere
    assert "abc" not in page.content.decode()  # the query is not the fragment: nothing of it is written
    # it hands the token to its own origin only: no other origin is named in its script
    assert not re.search(r"https?://", script) and "window.location.origin" in script
    assert "postMessage" not in script and "fetch(" not in script
