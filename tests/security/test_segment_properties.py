"""Segment properties as an attacker meets them: nothing of a body is read before the caller is
known and allowed on the channel; a read-only grant, or a grant on another channel, writes
nothing; bodies are bounded before parsing (size, depth) and after (segments per request); every
id spelling but one is refused (negative, 0, 2^64, non-digits, Unicode digits, leading zeros, JSON
numbers); text that PostgreSQL or Neuroglancer cannot take is refused with a 400, never a 500;
every write is audited with its parsed target; the Neuroglancer file is read-only."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from ndstore.api.gate import CONTROL_BODY_LIMIT
from ndstore.api.models import AuditEntry, Channel, Grant, SegmentProperty
from tests.api.conftest import client_for, make_dataset
from tests.security.conftest import CountingBody, token_for, wsgi

TOP = 2**64 - 1
API = "/v1/segments/sx/e1/ann"
FILES = ("/precomputed/sx/e1/ann/segment_properties/info", "/precomputed-sharded/sx/e1/ann/segment_properties/info")


@pytest.fixture
def private(admin: APIClient) -> APIClient:
    """A private collection `sx` with annotation channels ann (uint64) and ann2, and a segment."""
    make_dataset(admin, "sx", frame=(300, 300, 8), levels=1, channels={"ann": "uint64", "ann2": "uint64"})
    assert admin.post(f"{API}/", [{"id": "5", "name": "five"}], format="json").status_code == 200
    return admin


def granted(username: str, level: str, channel: str | None = None) -> str:
    """A user holding `level` on the collection sx, or on one of its channels; returns its token."""
    user, token = token_for(username)
    chan = Channel.objects.get(name=channel) if channel else None
    Grant.objects.create(user=user, collection=Channel.objects.get(name="ann").experiment.collection,
                         experiment=chan.experiment if chan else None, channel=chan, level=level)
    return token


def nothing_written() -> None:
    assert list(SegmentProperty.objects.values_list("label", flat=True)) == [f"{5:020d}"]


@pytest.mark.parametrize("method", ["POST", "PUT"])
@pytest.mark.parametrize("path", [f"{API}/", f"{API}/5/"])
def test_no_token_is_refused_before_the_body_is_read(private: APIClient, method: str, path: str) -> None:
    body = CountingBody(CONTROL_BODY_LIMIT // 2)
    answer = wsgi(method, path, body)
    assert answer.status == 401 and answer.read_when_answered == 0 and answer.json()["message"]
    nothing_written()


@pytest.mark.parametrize("path", [f"{API}/", f"{API}/5/", *FILES])
def test_a_private_channels_segments_are_not_told(private: APIClient, path: str) -> None:
    assert wsgi("GET", path).status == 401
    _, token = token_for("stranger")
    answer = wsgi("GET", path, token=token)
    assert answer.status == 403 and b"five" not in answer.body


@pytest.mark.parametrize(("who", "level", "channel"), [("reader", "read", None), ("other", "write", "ann2")])
@pytest.mark.parametrize(("method", "path"), [("POST", f"{API}/"), ("PUT", f"{API}/"), ("PUT", f"{API}/5/"),
                                              ("DELETE", f"{API}/5/")])
def test_without_write_permission_on_the_channel_nothing_is_read_or_written(
        private: APIClient, who: str, level: str, channel: str | None, method: str, path: str) -> None:
    token = granted(who, level, channel)
    body = CountingBody(CONTROL_BODY_LIMIT // 2)
    answer = wsgi(method, path, body, token=token)
    assert answer.status == 403 and answer.read_when_answered == 0, answer.body
    nothing_written()
    if channel:  # the grant is good where it is given
        assert wsgi("POST", "/v1/segments/sx/e1/ann2/", json.dumps([{"id": "9"}]).encode(), token=token).status == 200


def test_bodies_are_bounded_before_parsing(private: APIClient) -> None:
    token = granted("writer", "write")
    big = CountingBody(CONTROL_BODY_LIMIT + 1)
    answer = wsgi("POST", f"{API}/", big, token=token)
    assert answer.status == 413 and answer.read_when_answered == 0
    deep = ("[" * 10_000 + "]" * 10_000).encode()
    answer = wsgi("POST", f"{API}/", deep, token=token)
    assert answer.status == 400 and "deeper" in answer.json()["message"]
    many = json.dumps([{"id": str(i)} for i in range(1, 10_002)]).encode()
    answer = wsgi("POST", f"{API}/", many, token=token)
    assert answer.status == 400 and "at most 10000" in answer.json()["message"]
    answer = wsgi("POST", f"{API}/", b'[{"id": "7"}]', token=token, content_type="text/plain")
    assert answer.status == 415
    nothing_written()


BAD_IDS: list[Any] = ["-1", "0", str(2**64), str(10**40), "1a", "", " 7", "7 ", "+7", "0x10", "007", "1e3",
                      "\u0661\u0662", "\uff17", "\u2467", "7\n", 7, 2**64, -1, 1.5, None, True, ["7"], {"id": "7"}]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_every_spelling_of_an_id_but_one_is_refused(private: APIClient, bad: Any) -> None:
    r = private.post(f"{API}/", [{"id": bad, "name": "x"}], format="json")
    assert r.status_code == 400 and r.json()["message"].startswith("segment 0.id"), r.content
    nothing_written()


@pytest.mark.parametrize("bad", ["-1", "0", str(2**64), "1a", "%D9%A1%D9%A2", "%EF%BC%97", "007", "%20"])
def test_ids_in_the_path_are_refused_too(private: APIClient, bad: str) -> None:
    for method in ("get", "put", "delete"):
        r = getattr(private, method)(f"{API}/{bad}/", {"name": "x"}, format="json")
        assert r.status_code == 400 and "the id in the path" in r.json()["message"], (method, bad, r.content)
    nothing_written()


@pytest.mark.parametrize(("segment", "says"), [
    ({"id": "7", "name": "x" * 257}, "longer than 256"),
    ({"id": "7", "description": "x" * 4097}, "longer than 4096"),
    ({"id": "7", "name": "a\x00b"}, "control character"),
    ({"id": "7", "name": "line\nbreak"}, "control character"),
    ({"id": "7", "description": "\ud800"}, "lone surrogate"),
    ({"id": "7", "name": 7}, "must be a string"),
    ({"id": "7", "tags": "a"}, "list of strings"),
    ({"id": "7", "tags": ["a b"]}, "is not a tag"),
    ({"id": "7", "tags": ["#a"]}, "is not a tag"),
    ({"id": "7", "tags": ["x" * 65]}, "is not a tag"),
    ({"id": "7", "tags": ["\u0661"]}, "is not a tag"),
    ({"id": "7", "tags": [1]}, "is not a tag"),
    ({"id": "7", "tags": ["A", "a"]}, "twice"),
    ({"id": "7", "tags": [f"t{i}" for i in range(33)]}, "at most 32"),
    ({"id": "7", "colour": "red"}, "unknown fields"),
    ({"name": "x"}, "needs an id"),
])
def test_bad_fields_are_refused_by_name(private: APIClient, segment: dict[str, Any], says: str) -> None:
    # json.dumps escapes what is not ASCII: a lone surrogate travels as `\\ud800`
    r = private.post(f"{API}/", json.dumps([segment]), content_type="application/json")
    assert r.status_code == 400 and says in r.json()["message"], r.content
    nothing_written()


@pytest.mark.parametrize("body", [{}, "7", [], [1], [{"id": "7"}, {"id": "7"}]])
def test_bad_bodies_are_refused(private: APIClient, body: Any) -> None:
    r = private.post(f"{API}/", body, format="json")
    assert r.status_code == 400 and r.json()["message"], r.content
    nothing_written()


def test_a_put_of_one_cannot_name_another(private: APIClient) -> None:
    r = private.put(f"{API}/5/", {"id": "6", "name": "x"}, format="json")
    assert r.status_code == 400 and "differs from the id in the path" in r.json()["message"]
    nothing_written()


def test_every_write_is_audited_with_its_parsed_target(private: APIClient) -> None:
    AuditEntry.objects.all().delete()
    private.post(f"{API}/", [{"id": str(TOP), "name": "top"}, {"id": "8"}], format="json")
    private.put(f"{API}/9/", {"name": "nine"}, format="json")
    private.delete(f"{API}/9/")
    private.post(f"{API}/", [{"id": "0"}], format="json")
    rows = list(AuditEntry.objects.order_by("id").values_list("method", "status", "target"))
    assert rows == [("POST", 200, {"action": "write", "channel": "sx/e1/ann", "ids": [str(TOP), "8"]}),
                    ("PUT", 200, {"action": "write", "channel": "sx/e1/ann", "ids": ["9"]}),
                    ("DELETE", 204, {"action": "delete", "channel": "sx/e1/ann", "ids": ["9"]}),
                    ("POST", 400, None)]


@pytest.mark.parametrize("method", ["post", "put", "delete", "patch"])
@pytest.mark.parametrize("path", FILES)
def test_the_properties_file_is_read_only(private: APIClient, method: str, path: str) -> None:
    r = getattr(private, method)(path, [{"id": "7"}], format="json")
    assert r.status_code == 405 and r["Content-Type"] == "application/json" and r.json()["message"], r.content
    assert "7" not in private.get(path).json()["inline"]["ids"]


def test_a_reader_reads_and_an_anonymous_reader_of_a_public_collection_too(private: APIClient) -> None:
    reader = client_for(User.objects.get(username="root"))
    assert reader.get(f"{API}/5/").json()["name"] == "five"
    private.put("/v1/collection/sx/", {"public": True}, format="json")
    anonymous = APIClient()
    assert anonymous.get(f"{API}/5/").json()["name"] == "five"
    assert anonymous.get(FILES[0]).json()["inline"]["ids"] == ["5"]
    assert anonymous.post(f"{API}/", [{"id": "6"}], format="json").status_code == 401
