"""Annotation layers as a user meets them, on the live stack: a layer created, annotations written
through the API as JSON and CSV (idempotent by id), deleted by id, and read back as Neuroglancer
reads them from /precomputed-annotations/ (info, spatial cells, by_id, relationship indexes),
decoded by tests/annotation_decoder.py (written from the spec, apart from the server's encoder);
a write shows at once; 100,000 synapses written in bounded requests; the label channel's segment
properties count each segment's annotations."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from django.db import connection
from rest_framework.test import APIClient

from ndstore.api import annotation_index
from ndstore.api.models import AnnotationLayer, Channel
from ndstore.api.views.segments import annotation_counts
from tests.annotation_decoder import Decoded, multiple, single
from tests.api.conftest import make_dataset

FRAME = (2000, 1500, 200)
NM = {"x_voxel_size": 4.0, "y_voxel_size": 4.0, "z_voxel_size": 40.0}
API = "/v1/annotations/an/e1"
FILES = "/precomputed-annotations/an/e1"
SYNAPSES = {"annotation_type": "line", "segmentation": "ann",
            "properties": [{"id": "score", "type": "float32", "description": "detector confidence"},
                           {"id": "kind", "type": "uint8", "enum_values": [0, 1], "enum_labels": ["ex", "in"]},
                           {"id": "colour", "type": "rgb"}, {"id": "size", "type": "int16"}],
            "relationships": ["presyn", "postsyn"]}


@pytest.fixture
def layer(admin: APIClient) -> APIClient:
    make_dataset(admin, "an", frame=FRAME, levels=1, channels={"ann": "uint64", "img8": "uint8"}, frame_fields=NM)
    r = admin.post(f"{API}/syn/", SYNAPSES, format="json")
    assert r.status_code == 201, r.content
    return admin


def synapse(aid: int, pre: int, post: int, at: tuple[float, float, float] = (100.5, 200.25, 30.0),
            score: float = 0.5) -> dict[str, Any]:
    x, y, z = at
    return {"id": str(aid), "pointA": [x, y, z], "pointB": [x + 10, y - 5, z + 1],
            "properties": {"score": score, "kind": 1, "colour": "#ff8000", "size": -3},
            "relationships": {"presyn": [str(pre)], "postsyn": [str(post)]}}


def write(client: APIClient, body: Any, layer: str = "syn", **extra: Any) -> dict[str, Any]:
    r = client.post(f"{API}/{layer}/annotations/", body, format="json", **extra)
    assert r.status_code == 200, r.content
    return r.json()  # type: ignore[no-any-return]


def info(client: APIClient, layer: str = "syn") -> dict[str, Any]:
    r = client.get(f"{FILES}/{layer}/info")
    assert r.status_code == 200 and r["Access-Control-Allow-Origin"] == "*", r.content
    return r.json()  # type: ignore[no-any-return]


def binary(client: APIClient, path: str) -> bytes:
    r = client.get(path)
    assert r.status_code == 200 and r["Content-Type"] == "application/octet-stream", (path, r.content[:300])
    return bytes(r.content)


def every_cell(client: APIClient, layer: str = "syn") -> dict[int, list[Decoded]]:
    """level -> the annotations of all its cells (read cell by cell, only those holding some)."""
    meta = info(client, layer)
    out: dict[int, list[Decoded]] = {}
    for number, level in enumerate(meta["spatial"]):
        out[number] = []
        for cell in np.ndindex(*level["grid_shape"]):
            out[number] += multiple(binary(client, f"{FILES}/{layer}/spatial{number}/{'_'.join(map(str, cell))}"),
                                    meta)
    return out


def test_a_layer_is_created_listed_and_described(layer: APIClient) -> None:
    listed = layer.get(f"{API}/").json()["layers"]
    assert [(d["name"], d["annotation_type"], d["relationships"], d["segmentation"]) for d in listed] == \
        [("syn", "line", ["presyn", "postsyn"], "ann")]
    assert listed[0]["precomputed"] == f"{FILES}/syn"
    assert layer.post(f"{API}/syn/", SYNAPSES, format="json").status_code == 409
    meta = info(layer)
    assert meta["@type"] == "neuroglancer_annotations_v1" and meta["annotation_type"] == "LINE"
    assert meta["dimensions"] == {"x": [4e-9, "m"], "y": [4e-9, "m"], "z": [4e-8, "m"]}
    assert meta["lower_bound"] == [0, 0, 0] and meta["upper_bound"] == list(FRAME)
    assert meta["relationships"] == [{"id": "presyn", "key": "rel_presyn"}, {"id": "postsyn", "key": "rel_postsyn"}]
    assert meta["properties"] == SYNAPSES["properties"] and meta["by_id"] == {"key": "by_id"}
    assert multiple(binary(layer, f"{FILES}/syn/spatial0/0_0_0"), meta) == []


def test_json_writes_read_back_through_every_index(layer: APIClient) -> None:
    big = 2**64 - 1
    body = [synapse(1, 7, 8), synapse(2, 7, 9, at=(1500.0, 1000.0, 150.0), score=0.25), synapse(big, big, 8)]
    assert write(layer, body) == {"written": 3, "version": 1}
    meta = info(layer)
    cells = [a for level in every_cell(layer).values() for a in level]
    assert sorted(a.id for a in cells) == [1, 2, big]  # each in exactly one cell: short lines
    one = next(a for a in cells if a.id == 1)
    assert one.geometry == (100.5, 200.25, 30.0, 110.5, 195.25, 31.0)
    assert one.properties == {"score": 0.5, "kind": 1, "colour": [255, 128, 0], "size": -3}
    by_id = single(binary(layer, f"{FILES}/syn/by_id/{big}"), meta)
    assert by_id.related == [[big], [8]] and by_id.geometry[:3] == (100.5, 200.25, 30.0)
    assert sorted(a.id for a in multiple(binary(layer, f"{FILES}/syn/rel_presyn/7"), meta)) == [1, 2]
    assert sorted(a.id for a in multiple(binary(layer, f"{FILES}/syn/rel_postsyn/8"), meta)) == [1, big]
    assert multiple(binary(layer, f"{FILES}/syn/rel_postsyn/12345"), meta) == []
    assert layer.get(f"{FILES}/syn/by_id/3").status_code == 404


def test_csv_writes_with_a_header_row(layer: APIClient) -> None:
    csv = ("id,ax,ay,az,bx,by,bz,score,kind,colour,presyn,postsyn\n"
           "10,1,2,3,4,5,6,0.75,0,#00ff00,5,6 16\n"
           "11,10.5,20,30,40,50,60,,1,#0000ff,,\n")
    r = layer.generic("POST", f"{API}/syn/annotations/", csv.encode(), content_type="text/csv")
    assert r.status_code == 200, r.content
    meta = info(layer)
    ten = single(binary(layer, f"{FILES}/syn/by_id/10"), meta)
    assert ten.geometry == (1, 2, 3, 4, 5, 6) and ten.related == [[5], [6, 16]]
    assert ten.properties == {"score": 0.75, "kind": 0, "colour": [0, 255, 0], "size": 0}
    eleven = single(binary(layer, f"{FILES}/syn/by_id/11"), meta)
    assert eleven.properties["score"] == 0 and eleven.related == [[], []]


def test_a_rewrite_replaces_by_id_and_a_delete_removes(layer: APIClient) -> None:
    write(layer, [synapse(1, 7, 8), synapse(2, 7, 9)])
    again = write(layer, [synapse(1, 70, 80, at=(5.0, 6.0, 7.0), score=1.0)])
    assert again == {"written": 1, "version": 2}
    assert layer.get(f"{API}/syn/").json()["annotations"] == 2
    meta = info(layer)
    one = single(binary(layer, f"{FILES}/syn/by_id/1"), meta)
    assert one.geometry[:3] == (5.0, 6.0, 7.0) and one.related == [[70], [80]] and one.properties["score"] == 1.0
    assert [a.id for a in multiple(binary(layer, f"{FILES}/syn/rel_presyn/7"), meta)] == [2]
    assert [a.id for a in multiple(binary(layer, f"{FILES}/syn/rel_presyn/70"), meta)] == [1]
    r = layer.post(f"{API}/syn/annotations/delete/", ["1", 3], format="json")
    assert r.status_code == 200 and r.json() == {"deleted": 1, "version": 3}, r.content
    assert layer.get(f"{FILES}/syn/by_id/1").status_code == 404
    assert multiple(binary(layer, f"{FILES}/syn/rel_presyn/70"), meta) == []
    assert sorted(a.id for level in every_cell(layer).values() for a in level) == [2]


def test_a_write_shows_at_once(layer: APIClient) -> None:
    write(layer, [synapse(1, 7, 8)])
    first = layer.get(f"{FILES}/syn/spatial0/0_0_0")
    etag = first["ETag"]
    assert first["Cache-Control"] == "no-cache"
    assert layer.get(f"{FILES}/syn/spatial0/0_0_0", HTTP_IF_NONE_MATCH=etag).status_code == 304
    write(layer, [synapse(2, 7, 8)])
    second = layer.get(f"{FILES}/syn/spatial0/0_0_0", HTTP_IF_NONE_MATCH=etag)
    assert second.status_code == 200
    assert sorted(a.id for a in multiple(second.content, info(layer))) == [1, 2]


def test_deleting_a_layer_and_its_label_channel(layer: APIClient) -> None:
    write(layer, [synapse(1, 7, 8)])
    refused = layer.delete("/v1/collection/an/experiment/e1/channel/ann/")
    assert refused.status_code == 409 and "syn" in refused.json()["message"]
    assert layer.delete(f"{API}/syn/").status_code == 204
    assert layer.get(f"{FILES}/syn/info").status_code == 404
    assert layer.get(f"{API}/").json() == {"layers": []}


def test_other_types_and_no_relationships(layer: APIClient) -> None:
    for kind, geometry in (("point", {"point": [1, 2, 3]}), ("ellipsoid", {"center": [50, 50, 5], "radii": [4, 4, 1]}),
                           ("axis_aligned_bounding_box", {"pointA": [9, 9, 9], "pointB": [1, 2, 3]})):
        r = layer.post(f"{API}/{kind[:4]}/", {"annotation_type": kind}, format="json")
        assert r.status_code == 201, r.content
        write(layer, [{"id": 5, **geometry}], layer=kind[:4])
        meta = info(layer, kind[:4])
        assert meta["relationships"] == [] and meta["properties"] == []
        decoded = single(binary(layer, f"{FILES}/{kind[:4]}/by_id/5"), meta)
        assert decoded.geometry == tuple(float(v) for key in geometry for v in geometry[key])


def test_segment_properties_count_each_segments_annotations(layer: APIClient) -> None:
    write(layer, [synapse(1, 7, 8), synapse(2, 7, 9), synapse(3, 9, 8)])
    props = layer.get("/precomputed/an/e1/ann/segment_properties/info").json()["inline"]
    values = {p["id"]: dict(zip(props["ids"], p["values"])) for p in props["properties"]}
    assert values["syn_presyn"] == {"7": 2, "8": 0, "9": 1}
    assert values["syn_postsyn"] == {"7": 0, "8": 2, "9": 1}
    first = layer.get("/precomputed/an/e1/ann/segment_properties/info")
    assert first["Cache-Control"].endswith("no-cache")  # the counts change with each write: asked again
    write(layer, [synapse(4, 7, 8)])
    again = layer.get("/precomputed/an/e1/ann/segment_properties/info", HTTP_IF_NONE_MATCH=first["ETag"])
    assert again.status_code == 200
    props = again.json()["inline"]
    assert dict(zip(props["ids"], next(p["values"] for p in props["properties"] if p["id"] == "syn_presyn"))) == \
        {"7": 3, "8": 0, "9": 1}
    # a worker holds the largest counts only, however many segments writers related annotations to
    chan = Channel.objects.get(name="ann", experiment__name="e1")
    assert annotation_counts(chan, most=2) == {"syn_presyn": {7: 3}, "syn_postsyn": {8: 3}}


def test_100k_synapses_through_the_api_in_bounded_requests(layer: APIClient) -> None:
    """100,000 synapse lines written as CSV, 10,000 a request (each under 1 MiB); every
    annotation lands in exactly one spatial cell; one segment's relationship index lists its
    annotations. Times are printed (pytest -s) for docs/design/annotations.md."""
    n, per = 100_000, 10_000
    rng = np.random.default_rng(51)
    at = rng.uniform([0, 0, 0], [FRAME[0] - 20, FRAME[1] - 20, FRAME[2] - 2], (n, 3)).round(2)
    pre, post = rng.integers(1, 2000, n), rng.integers(1, 2000, n)
    started = time.perf_counter()
    for start in range(0, n, per):
        lines = [f"{i + 1},{x},{y},{z},{x + 10},{y + 10},{z + 1},{i % 100 / 100},{p},{q}"
                 for i, (x, y, z), p, q in zip(range(start, start + per), at[start:start + per],
                                               pre[start:start + per], post[start:start + per])]
        body = ("id,ax,ay,az,bx,by,bz,score,presyn,postsyn\n" + "\n".join(lines)).encode()
        assert len(body) < 1 << 20
        r = layer.generic("POST", f"{API}/syn/annotations/", body, content_type="text/csv")
        assert r.status_code == 200, r.content
    written = time.perf_counter() - started
    started = time.perf_counter()
    meta = info(layer)
    built = time.perf_counter() - started
    print(f"\n100k synapses: written in {written:.1f} s, info (index built) in {built:.2f} s; levels: "
          f"{[(s['grid_shape'], s['limit']) for s in meta['spatial']]}")
    seen = np.zeros(n + 1, np.int64)
    for number, level in enumerate(meta["spatial"]):
        for cell in np.ndindex(*level["grid_shape"]):
            data = binary(layer, f"{FILES}/syn/spatial{number}/{'_'.join(map(str, cell))}")
            count = int(np.frombuffer(data[:8], "<u8")[0])
            assert count <= level["limit"]
            ids = np.frombuffer(data[len(data) - 8 * count:], "<u8").astype(np.int64)
            np.add.at(seen, ids, 1)
    assert seen[0] == 0 and (seen[1:] >= 1).all()  # a line crossing a cell face is in both cells
    segment = int(pre[0])
    listed = multiple(binary(layer, f"{FILES}/syn/rel_presyn/{segment}"), meta)
    assert sorted(a.id for a in listed) == sorted(int(i) + 1 for i in np.flatnonzero(pre == segment))


@pytest.mark.django_db(transaction=True)  # the threads' own connections see the committed rows
def test_requests_at_once_after_a_write_wait_for_one_build(admin: APIClient, monkeypatch: Any) -> None:
    make_dataset(admin, "an", frame=FRAME, levels=1, channels={"ann": "uint64"}, frame_fields=NM)
    assert admin.post(f"{API}/syn/", SYNAPSES, format="json").status_code == 201
    write(admin, [synapse(i, 7, 8) for i in range(1, 101)])
    layer = AnnotationLayer.objects.select_related("experiment__coord_frame").get(name="syn")
    loads = []
    real_load = annotation_index._load

    def counted(*args: Any) -> Any:
        loads.append(threading.get_ident())
        time.sleep(0.3)  # a big layer's build: the others arrive meanwhile
        return real_load(*args)

    monkeypatch.setattr(annotation_index, "_load", counted)
    voxel = (4e-9, 4e-9, 40e-9)
    def request(_: int) -> Any:
        try:
            return annotation_index.built(layer, voxel)
        finally:
            connection.close()  # this thread's own

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(request, range(6)))
    assert len(loads) == 1 and all(a is answers[0] for a in answers)
    assert len(answers[0].ids) == 100


def test_a_build_reserves_what_it_holds_and_kept_builds_are_bounded(layer: APIClient, monkeypatch: Any) -> None:
    write(layer, [synapse(i, 7, 8) for i in range(1, 201)])
    assert layer.post(f"{API}/other/", SYNAPSES, format="json").status_code == 201
    write(layer, [synapse(i, 7, 8) for i in range(1, 11)], layer="other")
    layers = AnnotationLayer.objects.select_related("experiment__coord_frame")
    syn, other = layers.get(name="syn"), layers.get(name="other")
    voxel = (4e-9, 4e-9, 40e-9)
    asked: list[int] = []
    first = annotation_index.built(syn, voxel, asked.append)
    assert asked == [200 * (annotation_index.BUILD_ROW_BYTES + annotation_index.layout_of(syn).size)]
    assert annotation_index.built(syn, voxel, asked.append) is first and len(asked) == 1  # kept: nothing to hold
    # past the bytes kept, the least recently used build goes (the newest stays whatever its size)
    monkeypatch.setattr(annotation_index, "KEPT_BYTES", first.nbytes)
    annotation_index.built(other, voxel, asked.append)
    assert len(asked) == 2 and annotation_index._kept(syn, voxel) is None
    assert annotation_index._kept(other, voxel) is not None
