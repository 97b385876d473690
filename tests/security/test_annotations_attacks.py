"""Annotation layers as an attacker meets them: nothing of a body is read before the caller is
known and allowed on the experiment; a read-only grant, or a grant on another experiment, writes
nothing and creates no layer; bodies are bounded before parsing (size, depth, annotation count,
CSV rows); geometry, ids, property values and relationships are checked with a 400 naming the
problem (NaN, infinity, out of the frame, ids past uint64, segments past the label channel's
datatype); a layer cannot relate to a channel of another collection; a private layer's files are
not served anonymously; garbage CSV is a 400, never a 500; every write is audited."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from ndstore.api.annotation_body import MAX_PER_REQUEST
from ndstore.api.gate import CONTROL_BODY_LIMIT
from ndstore.api.models import Annotation, AnnotationLayer, AuditEntry, Collection, Experiment, Grant
from tests.api.conftest import make_dataset
from tests.security.conftest import CountingBody, token_for, wsgi

API = "/v1/annotations/ax/e1"
FILES = "/precomputed-annotations/ax/e1/syn"
WRITES = f"{API}/syn/annotations/"
LAYER = {"annotation_type": "point", "segmentation": "ann32",
         "properties": [{"id": "score", "type": "float32"},
                        {"id": "kind", "type": "uint8", "enum_values": [1, 2], "enum_labels": ["a", "b"]},
                        {"id": "colour", "type": "rgb"}],
         "relationships": ["pre"]}
CSV = "text/csv"


@pytest.fixture
def private(admin: APIClient) -> APIClient:
    """A private collection `ax` (frame 100 x 100 x 10) with a uint32 label channel and a layer `syn`
    holding annotation 1; a second collection `other` with its own label channel."""
    make_dataset(admin, "ax", frame=(100, 100, 10), levels=1, channels={"ann32": "uint32", "img": "uint8"})
    make_dataset(admin, "other", frame=(100, 100, 10), levels=1, channels={"ann": "uint64"})
    assert admin.post(f"{API}/syn/", LAYER, format="json").status_code == 201
    assert admin.post(WRITES, [{"id": "1", "point": [1, 2, 3]}], format="json").status_code == 200
    return admin


def granted(username: str, level: str, collection: str = "ax") -> str:
    user, token = token_for(username)
    coll = Collection.objects.get(name=collection)
    Grant.objects.create(user=user, collection=coll, experiment=Experiment.objects.get(collection=coll, name="e1"),
                         level=level)
    return token


def nothing_written() -> None:
    assert list(Annotation.objects.values_list("aid", flat=True)) == [1]
    assert list(AnnotationLayer.objects.values_list("name", "version")) == [("syn", 1)]


@pytest.mark.parametrize("path", [WRITES, f"{WRITES}delete/", f"{API}/new/"])
def test_no_token_is_refused_before_the_body_is_read(private: APIClient, path: str) -> None:
    answer = wsgi("POST", path, CountingBody(CONTROL_BODY_LIMIT // 2))
    assert answer.status == 401 and answer.read_when_answered == 0 and answer.json()["message"]
    assert wsgi("DELETE", f"{API}/syn/").status == 401
    nothing_written()


@pytest.mark.parametrize(("who", "level", "collection"), [("reader", "read", "ax"), ("other", "admin", "other")])
@pytest.mark.parametrize(("method", "path"), [("POST", WRITES), ("POST", f"{WRITES}delete/"), ("POST", f"{API}/new/"),
                                              ("DELETE", f"{API}/syn/")])
def test_without_write_permission_nothing_is_read_or_written(private: APIClient, who: str, level: str,
                                                            collection: str, method: str, path: str) -> None:
    token = granted(who, level, collection)
    answer = wsgi(method, path, CountingBody(CONTROL_BODY_LIMIT // 2), token=token)
    assert answer.status == 403 and answer.read_when_answered == 0, answer.body
    nothing_written()


@pytest.mark.parametrize("path", [f"{API}/", f"{API}/syn/", f"{FILES}/info", f"{FILES}/spatial0/0_0_0",
                                  f"{FILES}/by_id/1", f"{FILES}/rel_pre/5"])
def test_a_private_layer_is_not_served_anonymously(private: APIClient, path: str) -> None:
    anonymous = wsgi("GET", path)
    assert anonymous.status == 401 and anonymous.json()["message"]
    _, token = token_for("stranger")
    assert wsgi("GET", path, token=token).status == 403
    reader = granted("reader", "read")
    assert wsgi("GET", path, token=reader).status == 200
    bearer = wsgi("GET", path, extra={"HTTP_AUTHORIZATION": f"Bearer {reader}"})  # Neuroglancer's middleauth+
    assert bearer.status == 200 and bearer.content_type.startswith(("application/json", "application/octet-stream"))
    Collection.objects.filter(name="ax").update(public=True)
    assert wsgi("GET", path).status == 200


def test_bodies_are_bounded_before_parsing(private: APIClient) -> None:
    token = granted("writer", "write")
    answer = wsgi("POST", WRITES, CountingBody(CONTROL_BODY_LIMIT + 1), token=token)
    assert answer.status == 413 and answer.read_when_answered == 0
    answer = wsgi("POST", WRITES, CountingBody(CONTROL_BODY_LIMIT + 1), token=token, content_type=CSV)
    assert answer.status == 413 and answer.read_when_answered == 0
    deep = ("[" * 5_000 + "]" * 5_000).encode()
    answer = wsgi("POST", WRITES, deep, token=token)
    assert answer.status == 400 and "deeper" in answer.json()["message"]
    many = ("[" + ",".join(["{}"] * (MAX_PER_REQUEST + 1)) + "]").encode()
    answer = wsgi("POST", WRITES, many, token=token)
    assert answer.status == 413 and f"more than {MAX_PER_REQUEST}" in answer.json()["message"]
    rows = ("id,x,y,z\n" + "1,1,1,1\n" * (MAX_PER_REQUEST + 1)).encode()
    answer = wsgi("POST", WRITES, rows, token=token, content_type=CSV)
    assert answer.status == 413 and "rows" in answer.json()["message"]
    answer = wsgi("POST", WRITES, b'[{"id": "7", "point": [1, 2, 3]}]', token=token, content_type="text/plain")
    assert answer.status == 415
    nothing_written()


def point(**fields: Any) -> dict[str, Any]:
    return {"id": "7", "point": [1, 2, 3], **fields}


@pytest.mark.parametrize(("annotation", "says"), [
    (point(id=str(2**64)), "not an annotation id"), (point(id=2**64), "not an annotation id"),
    (point(id="0"), "digits"), (point(id="007"), "digits"), (point(id="\u0667"), "digits"),
    (point(id=-1), "not an annotation id"), (point(id="7a"), "digits"), (point(id=1.5), "decimal string"),
    (point(id=True), "decimal string"), (point(point=[1, 2]), "3 numbers"), (point(point=[1, 2, "3"]), "3 numbers"),
    (point(point=[1, 2, 1e39]), "finite float32"), (point(point=[1, 2, 1e300]), "finite float32"),
    (point(point=[-1, 2, 3]), "outside the experiment's frame"), (point(point=[1, 2, 10.5]), "outside"),
    (point(properties={"score": "high"}), "must be a number"), (point(properties={"score": 1e39}), "finite float32"),
    (point(properties={"kind": 3}), "enum_values"), (point(properties={"kind": 1.5}), "not an integer"),
    (point(properties={"kind": 256}), "outside uint8"), (point(properties={"colour": "#ff00"}), "hex digits"),
    (point(properties={"colour": [1, 2, 300]}), "hex digits"), (point(properties={"other": 1}), "no property"),
    (point(relationships={"pre": [str(2**32)]}), "beyond the channel's datatype"),
    (point(relationships={"pre": [2**32]}), "beyond the label channel's datatype"),
    (point(relationships={"pre": ["0"]}), "background"), (point(relationships={"pre": ["5", "5"]}), "twice"),
    (point(relationships={"pre": [str(i) for i in range(1, 66)]}), "at most 64"),
    (point(relationships={"post": ["5"]}), "no relationship"), (point(colour=1), "unknown fields"),
    (point(type="line"), "holds point annotations"), ([1, 2], "must be a JSON object"),
])
def test_bad_annotations_are_refused_by_name(private: APIClient, annotation: Any, says: str) -> None:
    body = annotation if isinstance(annotation, list) else [annotation]
    r = private.post(WRITES, body, format="json")
    assert r.status_code == 400 and says in r.json()["message"], r.content
    nothing_written()


@pytest.mark.parametrize(("body", "says"), [
    (b'[{"id": "7", "point": [1, 2, NaN]}]', "not a JSON number"),
    (b'[{"id": "7", "point": [1, 2, Infinity]}]', "not a JSON number"),
    (b'[{"id": "7", "id": "8", "point": [1, 2, 3]}]', "twice"),
    (b'[{"id": "7", "point": [1, 2, 3]}, {"id": 7, "point": [1, 2, 3]}]', "given twice"),
    (b'{"id": "7"}', "non-empty JSON list"), (b"[]", "non-empty JSON list"), (b"[1, 2", "JSON"),
    (b"\xff\xfe", "UTF-8"),
])
def test_bad_json_is_a_clear_400(private: APIClient, body: bytes, says: str) -> None:
    r = private.generic("POST", WRITES, body, content_type="application/json")
    assert r.status_code == 400 and says in r.json()["message"], r.content
    nothing_written()


@pytest.mark.parametrize(("text", "says"), [
    ("", "empty"), ("id,x,y,z\n", "no annotations"), ("id,x,y\n7,1,2\n", "missing"),
    ("id,x,y,z,=cmd|' /C calc'!A0\n7,1,2,3,1\n", "unknown column"), ("id,x,y,z\n=1+1,1,2,3\n", "digits"),
    ("id,x,y,z\n7,1,2,nan\n", "not a decimal number"), ("id,x,y,z\n7,1,2,inf\n", "not a decimal number"),
    ("id,x,y,z\n7,1,2,1e999\n", "finite float32"), ("id,x,y,z\n7,1_0,2,3\n", "not a decimal number"),
    ("id,x,y,z\n7,1,2\n", "fields"), ("id,x,y,z\n7,1,2,\"3\n", "does not parse"),
    ("id,x,y,z\n7,1,2,3\x00\n", "NUL"), ("id,x,y,z,pre\n7,1,2,3,5;6\n", "digits"),
    ("id,x,y,z,kind\n7,1,2,3,0x1\n", "not an integer"), ("id,id,x,y,z\n7,7,1,2,3\n", "twice"),
    ("id,x,y,z\n7,1,2,3\n7,1,2,3\n", "given twice"), ("id,x,y,z\n\u0667,1,2,3\n", "digits"),
])
def test_garbage_csv_is_a_clear_400(private: APIClient, text: str, says: str) -> None:
    r = private.generic("POST", WRITES, text.encode(), content_type=CSV)
    assert r.status_code == 400 and says in r.json()["message"], r.content
    nothing_written()


@pytest.mark.parametrize(("layer", "says"), [
    ({"annotation_type": "point", "relationships": ["pre"], "segmentation": "other/e1/ann"}, "has no channel"),
    ({"annotation_type": "point", "relationships": ["pre"], "segmentation": "ann"}, "has no channel"),
    ({"annotation_type": "point", "relationships": ["pre"], "segmentation": "img"}, "not a label"),
    ({"annotation_type": "point", "relationships": ["pre"]}, "name it in `segmentation`"),
    ({"annotation_type": "polyline"}, "annotation_type must be"),
    ({"annotation_type": "point", "properties": [{"id": "Bad", "type": "uint8"}]}, "must match"),
    ({"annotation_type": "point", "properties": [{"id": "a", "type": "uint64"}]}, "type must be one of"),
    ({"annotation_type": "point", "properties": [{"id": "a", "type": "uint8", "enum_values": [300],
                                                  "enum_labels": ["x"]}]}, "outside uint8"),
    ({"annotation_type": "point", "properties": [{"id": "a", "type": "rgb", "enum_values": [1],
                                                  "enum_labels": ["x"]}]}, "numeric type"),
    ({"annotation_type": "point", "properties": [{"id": f"p{i}", "type": "uint8"} for i in range(17)]}, "at most 16"),
    ({"annotation_type": "point", "relationships": ["a", "a"], "segmentation": "ann32"}, "twice"),
    ({"annotation_type": "point", "relationships": ["../x"], "segmentation": "ann32"}, "must match"),
    ({"annotation_type": "point", "owner": "me"}, "unknown fields"),
])
def test_bad_layers_are_refused_by_name(private: APIClient, layer: dict[str, Any], says: str) -> None:
    r = private.post(f"{API}/new/", layer, format="json")
    assert r.status_code == 400 and says in r.json()["message"], r.content
    nothing_written()


@pytest.mark.parametrize("path", [f"{FILES}/spatial9/0_0_0", f"{FILES}/spatial0/1_0_0", f"{FILES}/by_id/2",
                                  f"{FILES}/by_id/{2**64}", f"{FILES}/rel_post/5", f"{FILES}/rel_pre/-1",
                                  f"{FILES}/mesh/info", "/precomputed-annotations/ax/e1/none/info"])
def test_files_that_do_not_exist_are_a_json_4xx(private: APIClient, path: str) -> None:
    r = private.get(path)
    assert r.status_code in (400, 404) and r.json()["message"], (path, r.content)


def test_files_are_read_only(private: APIClient) -> None:
    for method in ("post", "put", "delete"):
        assert getattr(private, method)(f"{FILES}/info").status_code == 405
    nothing_written()


def test_every_change_is_audited_with_its_target(private: APIClient) -> None:
    token = granted("writer", "write")
    body = json.dumps([{"id": str(i), "point": [1, 1, 1]} for i in range(10, 20)] + [{"id": "3", "point": [1, 1, 1]}])
    assert wsgi("POST", WRITES, body.encode(), token=token).status == 200
    entry = AuditEntry.objects.filter(username="writer").first()
    assert entry is not None and entry.status == 200
    assert entry.target == {"action": "write", "annotation_layer": "ax/e1/syn", "annotations": 11,
                            "ids": ["3", "10-19"]}
    assert wsgi("POST", f"{WRITES}delete/", b'["10"]', token=token).status == 200
    assert AuditEntry.objects.filter(username="writer").first().target["action"] == "delete"  # type: ignore[union-attr]
