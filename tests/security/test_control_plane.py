"""The attacker of the control plane: no body is read, buffered or parsed before the caller is
known and allowed; bodies are JSON only, small and shallow, spelled one way; and every state
change is audited with who, what and its parsed target, or it does not happen (DESIGN §9)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from rest_framework.test import APIClient

from ndstore.api.models import AuditEntry, Collection, Grant, MetaValue
from tests.api.conftest import Dataset, client_for
from tests.security.conftest import CountingBody, token_for, wsgi

HUGE = 95 << 20  # the body of the report: an anonymous 95 MiB JSON cost a worker ~680 MiB
UNSAFE_ROUTES = [  # every kind of route that takes a body or changes state
    ("POST", "/v1/permissions/"), ("DELETE", "/v1/permissions/"), ("POST", "/v1/coord/f1/"),
    ("POST", "/v1/collection/c9/"), ("PUT", "/v1/collection/ds/"), ("DELETE", "/v1/collection/ds/"),
    ("POST", "/v1/collection/ds/experiment/e9/"), ("POST", "/v1/collection/ds/experiment/e1/channel/x/"),
    ("POST", "/v1/meta/ds/"), ("POST", "/v1/ingest/"), ("POST", "/v1/ingest/1/complete/"),
    ("POST", "/v1/downsample/ds/e1/img8/"), ("POST", "/v1/blaze/merge/"),
    ("POST", "/v1/cutout/ds/e1/img8/0/0:16/0:16/0:2/"), ("POST", "/v1/blaze/cutout/ds/e1/img8/0/0:16/0:16/0:2/"),
    ("POST", "/v1/direct/cutout/ds/e1/img8/0/0:16/0:16/0:2/"),
    ("PUT", "/v1/cutout/to_black/ds/e1/img8/0/0:16/0:16/0:2/"),
]


@pytest.fixture
def ds(admin: APIClient) -> Dataset:
    from tests.api.conftest import make_dataset

    return make_dataset(admin, name="ds")


@pytest.mark.parametrize(("method", "path"), UNSAFE_ROUTES)
def test_an_anonymous_body_is_never_read(ds: Dataset, method: str, path: str) -> None:
    body = CountingBody(HUGE)
    answer = wsgi(method, path, body)
    assert answer.status == 401 and answer.content_type == "application/json", answer.body[:200]
    assert body.read_bytes == 0


def test_a_bad_token_is_refused_before_the_body(ds: Dataset) -> None:
    body = CountingBody(HUGE)
    answer = wsgi("POST", "/v1/permissions/", body, token="not-a-token")
    assert answer.status == 401 and body.read_bytes == 0


@pytest.mark.parametrize("path", ["/v1/permissions/", "/v1/ingest/"])
def test_a_user_with_no_grant_to_use_is_refused_before_the_body(ds: Dataset, path: str) -> None:
    """Where the target is in the body, the caller must hold the level the action needs on
    something before the body is parsed (then on the target itself, after)."""
    _, key = token_for("nobody")
    body = CountingBody(512 << 10)  # under the control plane's limit
    answer = wsgi("POST", path, body, token=key)
    assert answer.status == 403 and body.read_bytes == 0, answer.body[:300]


def test_a_control_plane_body_over_the_limit_is_413_unread(ds: Dataset) -> None:
    _, key = token_for("boss", is_superuser=True, is_staff=True)
    body = CountingBody(2 << 20)
    answer = wsgi("POST", "/v1/permissions/", body, token=key)
    assert answer.status == 413 and "1048576" in answer.json()["message"]
    assert body.read_bytes == 0


def test_json_nested_thousands_deep_is_a_400_with_an_audit_row(admin: APIClient, ds: Dataset) -> None:
    deep = "[" * 5000 + "]" * 5000
    r = admin.generic("POST", "/v1/permissions/", deep, content_type="application/json")
    assert r.status_code == 400 and r["Content-Type"] == "application/json"
    assert "deeper than" in r.json()["message"]
    row = AuditEntry.objects.filter(path="/v1/permissions/").latest("id")
    assert row.status == 400 and row.username == "root"


@pytest.mark.parametrize("content_type", ["application/*", "*/*", "text/plain", "application/x-www-form-urlencoded",
                                          "application/json-patch+json", "application/json; charset=latin-1"])
def test_only_json_is_parsed(admin: APIClient, ds: Dataset, content_type: str) -> None:
    User.objects.create(username="bob")
    body = '{"user": "bob", "collection": "ds", "level": "admin"}'
    r = admin.generic("POST", "/v1/permissions/", body, content_type=content_type)
    assert r.status_code == 415, r.content
    assert not Grant.objects.filter(user__username="bob").exists()


@pytest.mark.parametrize("body", ['{"user": "bob", "collection": "ds", "level": "read", "x": NaN}',
                                  '{"user": "bob", "collection": "ds", "level": Infinity}',
                                  '{"user": "bob", "collection": "ds", "level": "read", "level": "admin"}'])
def test_json_spelled_two_ways_is_refused(admin: APIClient, ds: Dataset, body: str) -> None:
    """NaN and Infinity are not JSON; a key given twice has two meanings. Either could make what
    is applied differ from what is audited: both are refused, and nothing changes."""
    User.objects.create(username="bob")
    r = admin.generic("POST", "/v1/permissions/", body, content_type="application/json")
    assert r.status_code == 400, r.content
    assert not Grant.objects.filter(user__username="bob").exists()
    assert AuditEntry.objects.filter(path="/v1/permissions/").latest("id").status == 400


def _audited(path: str) -> dict[str, Any]:
    row = AuditEntry.objects.filter(path=path).latest("id")
    return {"user": row.username, "status": row.status, "target": row.target, "body": row.body}


def test_changes_with_nan_in_their_body_are_audited_or_do_not_happen(admin: APIClient, ds: Dataset) -> None:
    """A channel DELETE, a revoke and a metadata change, each with NaN in a JSON body: each was
    applied with no audit row (the insert failed and the error was swallowed)."""
    bob = User.objects.create(username="bob")
    Grant.objects.create(user=bob, collection=Collection.objects.get(name="ds"), level="read")
    nan = '{"note": NaN}'

    r = admin.generic("POST", "/v1/meta/ds/?key=k&value=v", nan, content_type="application/json")
    assert MetaValue.objects.filter(key="k").exists() == (r.status_code == 201)
    if r.status_code == 201:
        assert _audited("/v1/meta/ds/")["target"]["key"] == "k"

    r = admin.generic("DELETE", "/v1/permissions/", '{"user": "bob", "collection": "ds", "n": NaN}',
                      content_type="application/json")
    assert r.status_code == 400 and Grant.objects.filter(user=bob).exists()

    path = "/v1/collection/ds/experiment/e1/channel/img8/"
    r = admin.generic("DELETE", path, nan, content_type="application/json")
    assert r.status_code in (204, 400)
    if r.status_code == 204:
        audited = _audited(path)
        assert audited["status"] == 204 and audited["target"]["channel"] == "ds/e1/img8"


def test_query_string_targets_are_audited_with_what_they_name(admin: APIClient, ds: Dataset) -> None:
    bob = User.objects.create(username="bob")
    Grant.objects.create(user=bob, collection=Collection.objects.get(name="ds"), level="read")
    assert admin.delete("/v1/permissions/?user=bob&collection=ds").status_code == 204
    revoke = _audited("/v1/permissions/")
    assert revoke["target"] == {"action": "revoke", "user": "bob", "resource": "ds"}
    assert admin.post("/v1/meta/ds/?key=stain&value=osmium").status_code == 201
    assert admin.put("/v1/meta/ds/?key=stain&value=uranyl").status_code == 200
    meta = _audited("/v1/meta/ds/")
    assert meta["target"] == {"action": "change", "resource": "ds", "key": "stain", "value": "uranyl"}


def test_a_target_in_both_query_and_body_is_refused(admin: APIClient, ds: Dataset) -> None:
    bob = User.objects.create(username="bob")
    Grant.objects.create(user=bob, collection=Collection.objects.get(name="ds"), level="read")
    r = admin.generic("DELETE", "/v1/permissions/?user=bob&collection=ds", '{"user": "root", "collection": "ds"}',
                      content_type="application/json")
    assert r.status_code == 400 and "not both" in r.json()["message"]
    assert Grant.objects.filter(user=bob).exists()


@pytest.fixture
def audit_log_refuses_writes(db: Any) -> None:
    """The audit table refuses inserts, as a full disk or a revoked privilege would (SQLite)."""
    table = AuditEntry._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TRIGGER audit_refuses BEFORE INSERT ON {table} "
                       "BEGIN SELECT RAISE(ABORT, 'the audit log is unavailable'); END")


def test_without_an_audit_row_no_change_happens(admin: APIClient, ds: Dataset, audit_log_refuses_writes: None) -> None:
    User.objects.create(username="bob")
    actions = [("post", "/v1/collection/newc/", {}), ("post", "/v1/permissions/",
                                                       {"user": "bob", "collection": "ds", "level": "admin"}),
               ("delete", "/v1/collection/ds/experiment/e1/channel/img8/", None),
               ("post", "/v1/meta/ds/?key=a&value=b", None)]
    for method, path, body in actions:
        r = getattr(admin, method)(path, body, format="json") if body is not None else getattr(admin, method)(path)
        assert r.status_code == 503 and "audit" in r.json()["message"], (path, r.content)
    assert not Collection.objects.filter(name="newc").exists()
    assert not Grant.objects.filter(user__username="bob").exists()
    assert admin.get("/v1/collection/ds/experiment/e1/channel/img8/").status_code == 200
    assert not MetaValue.objects.filter(key="a").exists()


def test_every_state_change_records_its_parsed_target(admin: APIClient, ds: Dataset, ingest_env: str) -> None:
    """Each audited route, once: the row names who and the target as the view understood it."""
    User.objects.create(username="bob")
    actions = [
        ("POST", "/v1/coord/f2/", {"x_stop": 64, "y_stop": 64, "z_stop": 8}, {"coord": "f2"}),
        ("PUT", "/v1/coord/f2/", {"description": "d"}, {"coord": "f2"}),
        ("POST", "/v1/collection/c2/", {}, {"collection": "c2"}),
        ("PUT", "/v1/collection/c2/", {"description": "x"}, {"collection": "c2"}),
        ("POST", "/v1/collection/ds/experiment/e2/", {"coord_frame": "f2"}, {"experiment": "ds/e2"}),
        ("POST", "/v1/collection/ds/experiment/e2/channel/k/", {"datatype": "uint8"}, {"channel": "ds/e2/k"}),
        ("POST", "/v1/permissions/", {"user": "bob", "collection": "ds", "experiment": "e2", "level": "read"},
         {"user": "bob", "resource": "ds/e2", "level": "read"}),
        ("POST", "/v1/meta/ds/e2/?key=a&value=b", None, {"resource": "ds/e2", "key": "a"}),
        ("DELETE", "/v1/meta/ds/e2/?key=a", None, {"resource": "ds/e2", "key": "a"}),
        ("POST", "/v1/downsample/ds/e2/k/", None, {"channel": "ds/e2/k"}),
        ("POST", "/v1/ingest/", {"collection": "ds", "experiment": "e2", "channel": "k", "x_start": 0, "x_stop": 64,
                                 "y_start": 0, "y_stop": 64, "z_start": 0, "z_stop": 8, "tile_size_x": 64,
                                 "tile_size_y": 64}, {"action": "create", "channel": "ds/e2/k"}),
        ("DELETE", "/v1/ingest/{job}/", None, {"action": "cancel", "channel": "ds/e2/k"}),
        ("POST", "/v1/blaze/merge/", None, {"action": "merge"}),
        ("DELETE", "/v1/collection/ds/experiment/e2/channel/k/", None, {"channel": "ds/e2/k"}),
        ("DELETE", "/v1/collection/ds/experiment/e2/", None, {"experiment": "ds/e2"}),
        ("DELETE", "/v1/collection/c2/", None, {"collection": "c2"}),
        ("DELETE", "/v1/coord/f2/", None, {"coord": "f2"}),
    ]
    job = None
    for method, path, body, expected in actions:
        path = path.format(job=job)
        r = admin.generic(method, path, "" if body is None else json.dumps(body), content_type="application/json")
        job = r.json().get("id", job) if r.content and path == "/v1/ingest/" else job
        assert r.status_code < 300, (method, path, r.content)
        row = AuditEntry.objects.filter(path=path.split("?")[0], method=method).latest("id")
        assert row.username == "root" and row.status == r.status_code, (method, path)
        assert row.target is not None and expected.items() <= row.target.items(), (method, path, row.target)


def test_the_audit_log_shows_targets(admin: APIClient, ds: Dataset) -> None:
    bob = User.objects.create(username="bob")
    Grant.objects.create(user=bob, collection=Collection.objects.get(name="ds"), level="read")
    admin.delete("/v1/permissions/?user=bob&collection=ds")
    entry = admin.get("/v1/audit/?limit=1").json()["entries"][0]
    assert entry["target"] == {"action": "revoke", "user": "bob", "resource": "ds"}


def test_a_user_without_admin_learns_nothing_from_a_grant_attempt(ds: Dataset) -> None:
    """The refusal is the same whether or not the target exists (no probing of names)."""
    mallory = client_for(User.objects.create(username="mallory"))
    Grant.objects.create(user=User.objects.get(username="mallory"), collection=Collection.objects.get(name="ds"),
                         level="write")
    for target in ({"user": "root", "collection": "ds", "level": "admin"},
                   {"user": "root", "collection": "no-such", "level": "admin"}):
        r = mallory.post("/v1/permissions/", target, format="json")
        assert r.status_code == 403, r.content
