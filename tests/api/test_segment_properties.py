"""Segment properties as a user meets them, on the live stack (moto S3 + DynamoDB, Redis): names,
descriptions and tags written through `/v1/segments/`, read back there and in Neuroglancer's
`segment_properties/info` with the voxel counts and boxes the label index holds, kept current
as the voxels change; uint64 labels past 2^63 end to end."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from rest_framework.test import APIClient

from tests.api.conftest import make_dataset

OCTET = "application/octet-stream"
TOP = 2**64 - 1
FRAME = (1100, 700, 20)
API = "/v1/segments/sp/e1/ann"
FILES = ("/precomputed/sp/e1/ann/segment_properties/info", "/precomputed-sharded/sp/e1/ann/segment_properties/info")
NUMBER_TYPES = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32"}


@pytest.fixture
def channel(admin: APIClient) -> APIClient:
    make_dataset(admin, "sp", frame=FRAME, levels=2, channels={"ann": "uint64", "ann32": "uint32", "img8": "uint8"})
    return admin


def supercuboid() -> tuple[int, int, int]:
    from ndstore.api import lookups
    from ndstore.api.models import Channel

    return lookups.channel_volume(Channel.objects.get(name="ann")).grid(0).supercuboid


def aligned(lo: tuple[int, ...], hi: tuple[int, ...]) -> list[int]:
    """The supercuboid-aligned box of a voxel box (clipped to the frame), x0 y0 z0 x1 y1 z1."""
    s = supercuboid()
    return [*(a // c * c for a, c in zip(lo, s)), *(min(f, -(-b // c) * c) for b, c, f in zip(hi, s, FRAME))]


def write(client: APIClient, label: int, lo: tuple[int, int, int], hi: tuple[int, int, int],
          prefix: str = "/v1/direct/cutout") -> None:
    shape = tuple(b - a for a, b in zip(lo, hi))[::-1]
    x, y, z = (f"{a}:{b}" for a, b in zip(lo, hi))
    r = client.post(f"{prefix}/sp/e1/ann/0/{x}/{y}/{z}/", np.full(shape, label, np.uint64).tobytes(),
                    content_type=OCTET)
    assert r.status_code == 201, r.content


def properties(client: APIClient, path: str = FILES[0]) -> dict[str, Any]:
    r = client.get(path)
    assert r.status_code == 200 and r["Content-Type"] == "application/json", r.content
    info = r.json()
    check_neuroglancer_format(info)
    return info


def by_id(info: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """id -> {property id: value}, tags as their names."""
    inline = info["inline"]
    out: dict[str, dict[str, Any]] = {i: {} for i in inline["ids"]}
    for prop in inline["properties"]:
        for i, value in zip(inline["ids"], prop["values"]):
            out[i][prop["id"]] = [prop["tags"][t] for t in value] if prop["type"] == "tags" else value
    return out


def check_neuroglancer_format(info: dict[str, Any]) -> None:
    """What Neuroglancer's parser (src/datasource/precomputed/frontend.ts, parseInlinePropertyMap)
    and segment_properties.md require of an inline properties file."""
    assert info["@type"] == "neuroglancer_segment_properties"
    ids = info["inline"]["ids"]
    assert all(isinstance(i, str) and i.isdigit() and 0 < int(i) <= TOP for i in ids)
    assert [int(i) for i in ids] == sorted({int(i) for i in ids})
    kinds = [p["type"] for p in info["inline"]["properties"]]
    assert all(kinds.count(k) <= 1 for k in ("label", "description", "tags"))
    for prop in info["inline"]["properties"]:
        assert isinstance(prop["id"], str) and len(prop["values"]) == len(ids)
        assert ("tags" in prop) == (prop["type"] == "tags") and ("data_type" in prop) == (prop["type"] == "number")
        if prop["type"] in ("label", "description", "string"):
            assert all(isinstance(v, str) for v in prop["values"])
        elif prop["type"] == "tags":
            assert "description" not in prop and len(set(t.lower() for t in prop["tags"])) == len(prop["tags"])
            assert all(" " not in t and not t.startswith("#") for t in prop["tags"])
            assert all(v == sorted(set(v)) and all(0 <= t < len(prop["tags"]) for t in v) for v in prop["values"])
        else:
            assert prop["type"] == "number" and prop["data_type"] in NUMBER_TYPES
            top = 2**32 - 1 if prop["data_type"] == "uint32" else float(np.finfo(np.float32).max)
            assert all(isinstance(v, int | float) and 0 <= v <= top for v in prop["values"])


def test_written_properties_are_read_back_through_the_api_and_the_file(channel: APIClient) -> None:
    segments = [{"id": str(TOP), "name": "last", "description": "the largest uint64", "tags": ["edge", "Big"]},
                {"id": "7", "name": "seven", "description": "line one\nline two", "tags": ["small"]},
                {"id": str(2**63), "name": "half", "tags": ["edge"]}]
    r = channel.post(f"{API}/", segments, format="json")
    assert r.status_code == 200 and r.json() == {"written": 3}, r.content
    page = channel.get(f"{API}/?limit=2").json()
    assert [s["id"] for s in page["segments"]] == ["7", str(2**63)] and page["next"] == str(2**63)
    rest = channel.get(f"{API}/?after={page['next']}&limit=2").json()
    assert rest == {"segments": [segments[0]], "next": None}
    assert channel.get(f"{API}/7/").json() == {**segments[1]}
    assert channel.get(f"{API}/{2**63}/").json() == {"description": "", **segments[2]}

    listed = by_id(properties(channel))
    assert list(listed) == ["7", str(2**63), str(TOP)]
    assert listed[str(TOP)] == {"label": "last", "description": "the largest uint64", "tags": ["Big", "edge"],
                                "voxels": 0, "x0": 0, "y0": 0, "z0": 0, "x1": 0, "y1": 0, "z1": 0}
    assert listed["7"]["tags"] == ["small"] and listed["7"]["description"] == "line one\nline two"

    # one segment replaced, one deleted; the rest untouched
    r = channel.put(f"{API}/7/", {"name": "renamed", "tags": []}, format="json")
    assert r.status_code == 200 and r.json() == {"id": "7", "name": "renamed", "description": "", "tags": []}
    assert channel.delete(f"{API}/{2**63}/").status_code == 204
    assert channel.get(f"{API}/{2**63}/").status_code == 404
    listed = by_id(properties(channel, FILES[1]))
    assert list(listed) == ["7", str(TOP)] and listed["7"]["label"] == "renamed" and listed["7"]["tags"] == []


def test_voxel_counts_and_boxes_come_from_the_label_index_and_follow_writes(channel: APIClient) -> None:
    s = supercuboid()
    write(channel, 5, (10, 20, 2), (40, 30, 6))
    write(channel, 2**63, (s[0] + 3, 5, 1), (s[0] + 13, 9, 3))
    listed = by_id(properties(channel))
    assert list(listed) == ["5", str(2**63)]
    assert listed["5"]["voxels"] == 30 * 10 * 4 and listed[str(2**63)]["voxels"] == 10 * 4 * 2
    assert [listed["5"][k] for k in ("x0", "y0", "z0", "x1", "y1", "z1")] == aligned((10, 20, 2), (40, 30, 6))
    assert listed["5"]["label"] == "" and listed["5"]["tags"] == []

    # a write that grows label 5 into the next supercuboid along x, and one that overwrites part of it
    write(channel, 5, (s[0] + 20, 100, 10), (s[0] + 30, 110, 12))
    write(channel, 9, (10, 20, 2), (20, 30, 6))
    listed = by_id(properties(channel))
    assert listed["5"]["voxels"] == 30 * 10 * 4 - 10 * 10 * 4 + 10 * 10 * 2
    assert [listed["5"][k] for k in ("x0", "y0", "z0", "x1", "y1", "z1")] == aligned((10, 20, 2),
                                                                                       (s[0] + 30, 110, 12))
    assert listed["9"]["voxels"] == 400

    # named segments merge with their counts
    assert channel.post(f"{API}/", [{"id": "5", "name": "five"}], format="json").status_code == 200
    assert by_id(properties(channel))["5"]["label"] == "five"


def test_a_cache_tier_write_is_in_the_properties_at_once(channel: APIClient) -> None:
    """The file writes the channel's dirty cached supercuboids back first, as boundingbox does."""
    write(channel, 11, (100, 100, 0), (110, 110, 2), prefix="/v1/cutout")
    assert by_id(properties(channel))["11"]["voxels"] == 200
    write(channel, 11, (100, 100, 2), (110, 110, 3), prefix="/v1/cutout")
    assert by_id(properties(channel))["11"]["voxels"] == 300


def test_the_file_is_named_in_the_info_and_cached_like_the_other_files(channel: APIClient) -> None:
    info = channel.get("/precomputed/sp/e1/ann/info").json()
    assert info["segment_properties"] == "segment_properties"
    first = channel.get(FILES[0], HTTP_ORIGIN="https://viewer.example")
    assert first.status_code == 200 and first["Access-Control-Allow-Origin"] and first["ETag"]
    again = channel.get(FILES[0], HTTP_IF_NONE_MATCH=first["ETag"])
    assert again.status_code == 304
    head = channel.head(FILES[0])
    assert head.status_code == 200 and head["Content-Length"] == str(len(first.content)) and not head.content
    whole = channel.get(FILES[0], HTTP_RANGE="bytes=0-9")  # a JSON document is sent whole, as the info is
    assert whole.status_code == 200 and whole.content == first.content
    channel.post(f"{API}/", [{"id": "3", "name": "three"}], format="json")
    assert channel.get(FILES[0], HTTP_IF_NONE_MATCH=first["ETag"]).status_code == 200


def test_a_large_channel_lists_the_named_then_the_largest_segments(channel: APIClient) -> None:
    from ndstore.engine.segments.properties import Extent, Written, segment_properties

    extents = {label: Extent(label * 10, (0, 0, 0), (1, 1, 1)) for label in range(1, 101)}
    info = segment_properties(extents, [3, 500], lambda labels: {n: Written(f"n{n}", "", ()) for n in labels},
                              max_listed=10)
    check_neuroglancer_format(info)
    assert [int(i) for i in info["inline"]["ids"]] == sorted([3, 500, *range(100, 92, -1)])
    assert info["ndstore"] == {**info["ndstore"], "segments": 101, "listed": 10, "omitted": 91}
    top = segment_properties({TOP: Extent(1, (0, 0, 0), (1, 1, 1)), 2**63: Extent(2, (0, 0, 0), (1, 1, 1))}, [TOP],
                             lambda labels: {}, max_listed=1)
    assert top["inline"]["ids"] == [str(TOP)]  # written first, though smaller
    small = segment_properties(extents, [], lambda labels: {}, max_bytes=1000)
    assert 0 < small["ndstore"]["listed"] < 12 and small["inline"]["ids"][-1] == "100"


def test_other_channels(channel: APIClient) -> None:
    assert channel.post("/v1/segments/sp/e1/ann32/", [{"id": str(2**32 - 1)}], format="json").status_code == 200
    r = channel.post("/v1/segments/sp/e1/ann32/", [{"id": str(2**32)}], format="json")
    assert r.status_code == 400 and "beyond the channel's datatype" in r.json()["message"]
    r = channel.get("/v1/segments/sp/e1/img8/")
    assert r.status_code == 400 and "annotation channels" in r.json()["message"]
    r = channel.get("/precomputed/sp/e1/img8/segment_properties/info")
    assert r.status_code == 404 and "annotation channels" in r.json()["message"]
